"""The confidence rewards, label-free: SelfCertaintyReward (INTUITOR, arXiv:2505.19590: each response's mean
KL(U || p)) and NegativeEntropyReward (RENT, arXiv:2505.22660: minus its mean entropy) by hand, their group-normalised
advantages equal to the authors' code's, RENT's format rule, a policy without logits refused at start-up, and a run
whose rewards are the rolled-out policy's own statistics, micro-batch by micro-batch at the sampling temperature."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import GroupNormalizedAdvantage
from rlvr_lightning.core.advantage_estimators import normalized_advantages
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import NegativeEntropyReward, SelfCertaintyReward, SortInclusionOrderingReward
from tests.modules.test_algorithm_options import UpdateSpy
from tests.modules.test_rlvr_module import fit
from tests.rewards.test_math_reward import make_rollout


class _Fixed:
    """The module `SelfCertaintyReward` reads: a policy whose logits are given, and the update's temperature."""

    def __init__(self, logits, temperature=1.0):
        logits_ = logits

        class FixedLogits(ToySortPolicy):
            def logit_statistics(self, rollout, statistic, temperature=1.0):
                return torch.where(rollout.response_mask > 0, statistic(logits_, rollout.response_ids, temperature), 0)

        self.policy = FixedLogits(vocab_size=3, prompt_length=1, embedding_dim=2)
        self.sampling = type("Sampling", (), {"temperature": temperature})()


def _reward(module, kind=SelfCertaintyReward, **kwargs):
    reward = kind(**kwargs)
    reward.setup(None, module, "fit")
    return reward


def test_the_mean_self_certainty_of_each_response_by_hand():
    # V = 3; token distributions (1/2, 1/4, 1/4) -> 0.056633 and (0.8, 0.1, 0.1) -> 0.510826 nats
    p = torch.tensor([[0.5, 0.25, 0.25], [0.8, 0.1, 0.1]])
    logits = torch.stack([p, p.flip(0), p]).log()  # [3 rows, 2 positions, V]
    rollout = make_rollout(["ab", "cd", "e"], lengths=[2, 2, 1])
    reward = _reward(_Fixed(logits))
    expected = [(0.056633 + 0.510826) / 2, (0.510826 + 0.056633) / 2, 0.056633]
    assert_close(reward(rollout), torch.tensor(expected), atol=1e-6, rtol=0)
    assert reward.kind == "shaping" and reward.name == "self_certainty"
    uniform = _reward(_Fixed(torch.zeros(3, 2, 3)))
    assert_close(uniform(rollout), torch.zeros(3))  # a uniform distribution is the least certain: 0


def test_the_sampling_temperature_sharpens_the_distribution_it_reads():
    p = torch.tensor([[[0.5, 0.25, 0.25]]])
    rollout = make_rollout(["a"], lengths=[1])
    sharp = p.pow(2) / p.pow(2).sum(-1, keepdim=True)  # softmax(log p / 0.5)
    expected = -math.log(3) - sharp.log().mean()
    assert _reward(_Fixed(p.log(), temperature=0.5))(rollout).item() == pytest.approx(expected.item(), rel=1e-6)


def test_a_response_without_tokens_scores_the_failure_value():
    rollout = make_rollout(["ab", ""], lengths=[2, 1])
    rollout.response_mask[1] = 0
    reward = _reward(_Fixed(torch.tensor([[0.5, 0.25, 0.25]]).log().expand(2, 2, 3)))
    assert_close(reward(rollout), torch.tensor([0.056633, 0.0]), atol=1e-6, rtol=0)
    assert reward.pop_errors() == 1


def intuitor_advantages(logits, response_mask, group_size, temperature):
    """The authors' verl code (sunblaze-ucb/Intuitor 3f0cdd7, verl-intuitor) restated: `self_certainty_from_logits`
    (torch_functional.py) on the temperature-scaled logits, `masked_mean(self_certaintys, mask, axis=-1)` as each
    response's score (ray_trainer.py, AdvantageEstimator.INTUITOR), then `compute_grpo_outcome_advantage`'s
    `(score - mean) / (std + 1e-6)` over each group (core_algos.py)."""
    logits = logits / temperature
    self_certainty = torch.logsumexp(logits, dim=-1) - logits.mean(dim=-1)
    scores = (self_certainty * response_mask).sum(-1) / response_mask.sum(-1)
    grouped = scores.view(-1, group_size)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).flatten()


def test_its_advantages_equal_the_authors_code():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        lengths = torch.randint(1, 7, (8,), generator=g).tolist()
        rollout = make_rollout(["x" * n for n in lengths], lengths=lengths, group_size=4)
        logits = 3 * torch.randn(8, max(lengths), 11, generator=g, dtype=torch.float64)
        ours = normalized_advantages(_reward(_Fixed(logits, 0.7))(rollout).double(), 4)
        theirs = intuitor_advantages(logits, rollout.response_mask.double(), 4, 0.7)
        assert_close(ours, theirs, atol=1e-5, rtol=0)  # the constant log V they leave in cancels in the group


def test_the_negative_mean_entropy_of_each_response_by_hand():
    # V = 3; entropies of (1/2, 1/4, 1/4): 1.5 ln 2 = 1.039721 and of (0.8, 0.1, 0.1): 0.639032 nats
    p = torch.tensor([[0.5, 0.25, 0.25], [0.8, 0.1, 0.1]])
    rollout = make_rollout(["ab", "c"], lengths=[2, 1])
    reward = _reward(_Fixed(torch.stack([p, p]).log()), NegativeEntropyReward)
    assert_close(reward(rollout), torch.tensor([-(1.039721 + 0.639032) / 2, -1.039721]), atol=1e-6, rtol=0)
    assert reward.kind == "shaping" and reward.name == "negative_entropy"


def test_rents_format_rule_scores_a_response_without_an_answer():
    p = torch.tensor([[0.8, 0.1, 0.1]]).expand(2, 3, 3)
    rollout = make_rollout(["so \\boxed{4}", "no answer"], lengths=[3, 3])
    reward = _reward(_Fixed(p.log()), NegativeEntropyReward, unanswered_score=-7.0)
    assert_close(reward(rollout), torch.tensor([-0.639032, -7.0]), atol=1e-6, rtol=0)


def rent_advantages(logits, response_mask, group_size, temperature):
    """The authors' verl code (satrams/rent-rl 5d4d38a) restated: `entropy_from_logits` (torch_functional.py) on the
    temperature-scaled logits, `entropys[i, :valid_response_length].mean() * -1.0` as each response's score
    (ray_trainer.py, minimize_entropy), then GRPO's `(score - mean) / (std + 1e-6)` over each group."""
    logits = logits / temperature
    pd = torch.nn.functional.softmax(logits, dim=-1)
    entropy = torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)
    scores = torch.stack([-row[: int(n)].mean() for row, n in zip(entropy, response_mask.sum(-1), strict=True)])
    grouped = scores.view(-1, group_size)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).flatten()


def test_rents_advantages_equal_the_authors_code():
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        lengths = torch.randint(1, 7, (10,), generator=g).tolist()
        rollout = make_rollout(["x" * n for n in lengths], lengths=lengths, group_size=5)
        logits = 3 * torch.randn(10, max(lengths), 11, generator=g, dtype=torch.float64)
        ours = normalized_advantages(_reward(_Fixed(logits, 0.9), NegativeEntropyReward)(rollout).double(), 5)
        assert_close(ours, rent_advantages(logits, rollout.response_mask.double(), 5, 0.9), atol=1e-5, rtol=0)


class CertaintySpy(ToySortPolicy):
    """Records the statistics it computes, the rows and the temperature."""

    def logit_statistics(self, rollout, statistic, temperature=1.0):
        values = super().logit_statistics(rollout, statistic, temperature)
        self.computed = getattr(self, "computed", []) + [(rollout.response_ids.clone(), values, temperature)]
        return values


@pytest.mark.parametrize(
    ("kind", "name", "sign"),
    [(SelfCertaintyReward, "self_certainty", 1.0), (NegativeEntropyReward, "negative_entropy", -1.0)],
)
def test_a_run_rewards_the_policys_own_statistic(in_tmp_dir, kind, name, sign):
    torch.manual_seed(0)
    policy = CertaintySpy(vocab_size=5, prompt_length=3, embedding_dim=4, eos_token=4)
    module = UpdateSpy(
        policy, group_size=4, update=UpdateConfig(micro_batch_size=8), sampling=SamplingConfig(temperature=0.8)
    )
    task = SortInclusionOrderingReward(weight=0.0)  # watched only
    _, recorder = fit(module, [kind(), task, GroupNormalizedAdvantage()], steps=2, batch_size=4)
    assert len(policy.computed) == 4  # two micro-batches of 8 rows per step
    for step, rollout in enumerate(module.trained_on):
        parts = policy.computed[2 * step : 2 * step + 2]
        assert torch.equal(torch.cat([ids for ids, _, _ in parts]), rollout.response_ids)
        assert all(temperature == 0.8 for _, _, temperature in parts)
        per_token, mask = torch.cat([values for _, values, _ in parts]), rollout.response_mask
        expected = sign * (per_token * mask).sum(-1) / mask.sum(-1)
        assert_close(rollout.rewards[name], expected)
        assert_close(rollout.reward, expected)  # the task reward's weight is 0
        assert recorder.steps[step][f"train/rewards/{name}"] == pytest.approx(float(expected.mean()), rel=1e-6)


class NoLogits(ToySortPolicy):
    logit_statistics = Policy.logit_statistics


@pytest.mark.parametrize("kind", [SelfCertaintyReward, NegativeEntropyReward])
def test_a_policy_without_logit_statistics_fails_at_start_up(in_tmp_dir, kind):
    module = RLVRModule(NoLogits(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=4)
    with pytest.raises(ValueError, match=f"{kind.__name__} reads the trained policy's logits, which NoLogits does"):
        fit(module, [kind(), GroupNormalizedAdvantage()], steps=1)
