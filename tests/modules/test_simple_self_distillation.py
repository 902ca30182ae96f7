"""`ExpertIterationModule(keep: all)`, simple self-distillation (SSD, arXiv:2604.01193): every non-empty sampled
response is fine-tuned on, unverified; rewards, where a run has them, are only logged."""

import copy

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.expert_iteration import ExpertIterationModule, non_empty
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.modules.pair_rollouts import pair_rollout
from rlvr_lightning.runtime.option_domains import OptionValueError
from tests.modules.test_expert_iteration import Fixed, KeptSpy, fit, toy


def test_empty_responses_are_dropped_by_hand():
    module = ExpertIterationModule(toy(), group_size=2, keep="all")
    rollout = pair_rollout(module.policy, [[1, 2, 3]] * 4, [[1, 2, 3]] * 4)
    rollout.response_text = ["1 2 3", " \n\t", "", "x"]
    rollout.response_mask[3] = 0  # no response token: nothing to learn from either
    assert non_empty(rollout).tolist() == [True, False, False, False]
    assert module.passing(rollout).tolist() == [True, False, False, False]
    rollout.response_text = None  # a policy without text (the toy): every row with a token counts
    assert module.passing(rollout).tolist() == [True, True, True, False]


def test_a_round_fine_tunes_on_every_response_without_a_reward(in_tmp_dir):
    """16 prompts x 4 responses, no RewardCallback: all 64 rows are kept and one optimizer step takes the
    token-mean negative log-likelihood of them all at temperature 1 (TRL `SSDTrainer.compute_loss`), by hand."""
    module = KeptSpy(toy(), group_size=4, keep="all", update=UpdateConfig(epochs=1))
    start = copy.deepcopy(module.policy)
    trainer = fit(module, [], rounds=1, val=False)
    (kept,) = module.fine_tuned
    assert kept.num_rows == 64 and trainer.global_step == 1
    with torch.no_grad():
        log_probs = torch.log_softmax(start(kept.prompt_ids), -1)
    by_hand = -log_probs.gather(-1, kept.response_ids.unsqueeze(-1)).squeeze(-1).mean()
    metrics = trainer.callback_metrics
    assert float(metrics["train/loss"]) == pytest.approx(float(by_hand), rel=1e-5)
    assert metrics["train/kept"] == 64 and "train/reward_mean" not in metrics and "train/prompts_solved" not in metrics


def test_rewards_are_logged_but_choose_nothing(in_tmp_dir):
    module = KeptSpy(toy(), group_size=4, keep="all", max_per_prompt=3, update=UpdateConfig(epochs=1))
    trainer = fit(module, [Fixed([0.0] * 64)], rounds=1, val=False)
    (kept,) = module.fine_tuned
    assert kept.num_rows == 16 * 3  # max_per_prompt still caps each prompt, whatever its rewards
    assert float(trainer.callback_metrics["train/reward_mean"]) == 0.0


def test_training_on_samples_at_a_low_temperature_sharpens_the_policy(in_tmp_dir):
    """SSD's mechanism: fine-tuning on samples drawn at T < 1 moves p toward p^(1/T), lowering its entropy; at T = 1
    the expected gradient of log p under p is zero and the entropy only drifts."""
    prompts = torch.tensor([[a, b, c] for a in range(5) for b in range(5) for c in range(5)])

    def entropy_after(temperature):
        policy = toy(seed=3)
        module = ExpertIterationModule(
            policy,
            optimizer=lambda p: torch.optim.Adam(p, lr=0.01),
            group_size=4,
            keep="all",
            sampling=SamplingConfig(temperature=temperature),
            update=UpdateConfig(epochs=1),
        )
        fit(module, [], rounds=10, val=False)
        with torch.no_grad():
            log_p = torch.log_softmax(policy(prompts), -1)
        return float(-(log_p.exp() * log_p).sum(-1).mean())

    # measured: 1.07 nats at the start, 0.67 after 10 rounds at T = 0.5, 1.12 at T = 1
    assert entropy_after(0.5) < entropy_after(1.0) - 0.3


def test_keep_all_refuses_a_reward_threshold_and_keep_names_its_choices():
    with pytest.raises(ValueError, match="reward_threshold=1.0 does not apply with keep='all'"):
        ExpertIterationModule(toy(), keep="all", reward_threshold=1.0)
    with pytest.raises(OptionValueError, match="keep.*'some'.*passing.*all"):
        ExpertIterationModule(toy(), keep="some")
