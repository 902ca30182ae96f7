"""A*-PO in a run: V* from the reference's own responses to each new prompt, kept per prompt; the loss reads the
reference's log-probs; combinations that cannot work fail at start-up."""

import pytest
import torch

from rlvr_lightning.advantages import OptimalValueAdvantage
from rlvr_lightning.advantages.optimal_value import optimal_values, prompt_key
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, DynamicSamplingConfig
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_algorithm_options import UpdateSpy
from .test_greedy_baseline import SampleSpy
from .test_rlvr_module import fit

SEQUENCE_MEAN = AggregationConfig(mode="seq-mean-token-mean")


def spy_module(**options):
    torch.manual_seed(0)
    policy = SampleSpy(vocab_size=5, prompt_length=3, embedding_dim=4)
    return policy, UpdateSpy(policy, group_size=1, loss="astar_po", aggregation=SEQUENCE_MEAN, **options)


def test_advantages_are_the_reward_minus_v_star_of_the_references_responses(in_tmp_dir):
    policy, module = spy_module()
    estimator = OptimalValueAdvantage(beta1=0.5, num_samples=4)
    fit(module, [SortInclusionOrderingReward(), estimator], steps=2, batch_size=4)
    reference = module.reference
    assert [(n, do_sample) for _, n, do_sample, _ in reference.calls] == [(4, True)] * 2  # the reference samples
    assert [n for _, n, _, _ in policy.calls] == [1, 1]  # one response per prompt from the policy
    seen = set()
    for step, rollout in enumerate(module.trained_on):
        prompts, _, _, sampled = reference.calls[step]
        step_prompts = policy.calls[step][0]  # the step's own prompts, each new one sampled once
        assert prompts == [p for p in map(list, dict.fromkeys(map(tuple, step_prompts))) if tuple(p) not in seen]
        seen.update(map(tuple, prompts))
        v_star = optimal_values(SortInclusionOrderingReward()(sampled).view(len(prompts), 4), 0.5)
        assert [estimator.values[prompt_key(p)] for p in prompts] == pytest.approx(v_star.tolist())
        per_row = torch.tensor([estimator.values[prompt_key(p)] for p in step_prompts])
        assert torch.allclose(rollout.advantages, rollout.reward - per_row.float())
        assert rollout.ref_log_probs is not None
    assert len(estimator.values) == len(seen)


def test_a_prompt_seen_before_is_not_sampled_again():
    class Module:
        sampling = None

        def __init__(self):
            self.reference = SampleSpy(vocab_size=5, prompt_length=3, embedding_dim=4)
            self.calls = []

        def score(self, rollout):
            rollout.reward = rollout.response_ids[:, 0].float()

    module, estimator = Module(), OptimalValueAdvantage(num_samples=2)
    module.sampling = RLVRModule(module.reference, group_size=1).sampling
    estimator.on_train_batch_start(None, module, {"prompt": [[1, 2, 3], [0, 4, 4]]}, 0)
    estimator.on_train_batch_start(None, module, {"prompt": [[0, 4, 4], [2, 2, 1], [2, 2, 1]]}, 1)
    sampled = [prompts for prompts, *_ in module.reference.calls]
    assert sampled == [[[1, 2, 3], [0, 4, 4]], [[2, 2, 1]]]  # only the new prompt, once
    expected = [estimator.values[(0, 4, 4)], *[estimator.values[(2, 2, 1)]] * 2]
    assert estimator._step_values.tolist() == pytest.approx(expected)
    restored = OptimalValueAdvantage(num_samples=2)
    restored.load_state_dict(estimator.state_dict())
    assert restored.values == estimator.values
    restored.on_train_batch_start(None, module, {"prompt": [[1, 2, 3]]}, 2)
    assert len(module.reference.calls) == 2  # known after a resume too


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(loss="ppo_clip"), "this run has none that samples: use the astar_po loss"),
        (dict(dynamic_sampling=DynamicSamplingConfig(enabled=True)), "with dynamic_sampling.enabled=true the trained"),
    ],
)
def test_what_cannot_work_fails_at_start_up(options, message, in_tmp_dir):
    torch.manual_seed(0)
    options = {"loss": "astar_po", "aggregation": SEQUENCE_MEAN, **options}
    group_size = 2 if "dynamic_sampling" in options else 1
    module = RLVRModule(SampleSpy(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=group_size, **options)
    with pytest.raises(ValueError, match=message):
        fit(module, [SortInclusionOrderingReward(), OptimalValueAdvantage()], steps=1)
