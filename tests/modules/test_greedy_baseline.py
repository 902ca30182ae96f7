"""`GreedyBaselineAdvantage` (ReMax) in a run: each step decodes one greedy response to each of its prompts, scores
it, and subtracts its reward from every sampled response to that prompt; combinations that would pair a baseline
with other prompts fail at start-up."""

import pytest
import torch

from rlvr_lightning.advantages import GreedyBaselineAdvantage
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import DynamicSamplingConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_algorithm_options import UpdateSpy
from .test_rlvr_module import fit


class SampleSpy(ToySortPolicy):
    """Records each call's prompts, `n`, `do_sample` and the rollout it returned."""

    def sample(self, batch, n, sampling, generator=None):
        rollout = super().sample(batch, n, sampling, generator)
        self.calls = getattr(self, "calls", []) + [(list(map(list, batch["prompt"])), n, sampling.do_sample, rollout)]
        return rollout


def test_each_response_is_credited_against_its_prompts_greedy_response(in_tmp_dir):
    torch.manual_seed(0)
    policy = SampleSpy(vocab_size=5, prompt_length=3, embedding_dim=4)
    module = UpdateSpy(policy, group_size=4)
    _, recorder = fit(module, [SortInclusionOrderingReward(), GreedyBaselineAdvantage()], steps=2, batch_size=4)
    assert [(n, do_sample) for _, n, do_sample, _ in policy.calls] == [(4, True), (1, False)] * 2
    for step, rollout in enumerate(module.trained_on):
        prompts, _, _, greedy = policy.calls[2 * step + 1]
        assert prompts == policy.calls[2 * step][0]  # the step's own prompts
        assert torch.equal(greedy.prompt_ids.repeat_interleave(4, dim=0), rollout.prompt_ids)
        expected = SortInclusionOrderingReward()(greedy).repeat_interleave(4)
        assert torch.equal(rollout.greedy_reward, expected)
        assert torch.equal(rollout.advantages, rollout.reward - expected)
    assert any((rollout.advantages != 0).any() for rollout in module.trained_on)
    logged = [step["train/greedy_reward_mean"] for step in recorder.steps]
    assert logged == pytest.approx([float(call[3].reward.mean()) for call in policy.calls[1::2]])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(dynamic_sampling=DynamicSamplingConfig(enabled=True)), "with dynamic_sampling.enabled=true the trained"),
        (dict(rollout_staleness=1), "with rollout_staleness >= 1 the trained rollout holds other prompts"),
    ],
)
def test_a_baseline_for_other_prompts_fails_at_start_up(options, message, in_tmp_dir):
    torch.manual_seed(0)
    module = RLVRModule(ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=4, **options)
    with pytest.raises(ValueError, match=f"GreedyBaselineAdvantage decodes a greedy response .* {message}"):
        fit(module, [SortInclusionOrderingReward(), GreedyBaselineAdvantage()], steps=1)
