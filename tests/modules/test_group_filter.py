"""`group_filter: {keep, metric}`, GFPO (arXiv:2508.09726): the kept rows and their advantages by hand, the
metrics, top-ups filtered as the batch is, and refusals that name the option."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_lightning.advantages import GreedyBaselineAdvantage, GroupNormalizedAdvantage, RLOOAdvantage
from rlvr_lightning.modules import PPOModule, RLVRModule
from rlvr_lightning.modules.group_filter import GroupFilterConfig
from rlvr_lightning.modules.options import DynamicSamplingConfig, ReplayConfig, UpdateConfig
from rlvr_lightning.rewards import SortAndStopReward
from rlvr_lightning.runtime.option_domains import OptionValueError
from tests.modules.test_bias_metrics import fit as bias_metrics_fit
from tests.modules.test_bias_metrics import policy
from tests.rewards.test_math_reward import Recorder

PROMPTS = 16


class SeenReward(SortAndStopReward):
    """SortAndStopReward that keeps every rollout it scores: the whole sample, before the filter."""

    def __init__(self):
        super().__init__(stop="any", stop_bonus=0.0)
        self.seen = []

    def score(self, rollout):
        self.seen.append(rollout)
        return super().score(rollout)


def fit(module, advantage=None, steps=2):
    """`advantage`: the AdvantageCallback (None: GRPO's; False: none, for PPOModule). The rollouts scored (the whole
    sample) and each step's metrics."""
    reward, metrics = SeenReward(), Recorder()
    advantages = [] if advantage is False else [advantage or GroupNormalizedAdvantage()]
    bias_metrics_fit(module, [reward, *advantages, metrics], steps=steps)  # 16 prompts a step, as PROMPTS says
    return reward.seen, metrics.steps


def max_variance_by_hand(rewards, group_size, keep):
    """Each group's `keep` rows of largest reward variance (PODS), searched over every subset: of equal variances
    the one `max_variance_rows` documents (fewest high rewards; ties among rewards by the stable sort)."""
    rows = []
    for g in range(len(rewards) // group_size):
        r = rewards[g * group_size : (g + 1) * group_size]
        order = sorted(range(group_size), key=lambda i: r[i])  # stable ascending
        candidates = [sorted(order[: keep - i] + order[group_size - i :]) for i in range(keep + 1)]
        variances = [torch.tensor([r[i] for i in c], dtype=torch.float64).var(unbiased=False) for c in candidates]
        best = next(c for c, v in zip(candidates, variances, strict=True) if v >= max(variances) - 1e-12)
        rows += [g * group_size + i for i in best]
    return rows


def kept_by_hand(scores, group_size, keep):
    """Each group's `keep` highest scores (the earlier row of equal ones), in row order."""
    rows = []
    for g in range(len(scores) // group_size):
        ranked = sorted(range(group_size), key=lambda i: (-scores[g * group_size + i], i))[:keep]
        rows += [g * group_size + i for i in sorted(ranked)]
    return rows


@pytest.mark.parametrize("metric", ["length", "token_efficiency", "max_variance"])
def test_each_group_trains_on_its_kept_responses_with_advantages_over_them(metric):
    module = RLVRModule(policy(), group_size=6, group_filter=GroupFilterConfig(keep=3, metric=metric))
    seen, steps = fit(module)
    sampled, trained = seen[-1], module.last_rollout
    assert sampled.num_rows == PROMPTS * 6 and trained.num_rows == PROMPTS * 3 and trained.group_size == 3
    lengths, rewards = sampled.response_mask.sum(-1).tolist(), sampled.reward.tolist()
    assert len(set(lengths)) > 3  # the responses' lengths vary
    scores = [-n if metric == "length" else r / max(n, 1) for n, r in zip(lengths, rewards, strict=True)]
    rows = kept_by_hand(scores, 6, 3) if metric != "max_variance" else max_variance_by_hand(rewards, 6, 3)
    assert torch.equal(trained.response_ids, sampled.response_ids[rows])
    assert torch.equal(trained.reward, sampled.reward[rows])
    # GRPO's advantage over the kept three: (r - mean) / (std + 1e-6), 0 where they agree
    expected = []
    for g in range(PROMPTS):
        kept = [rewards[i] for i in rows[3 * g : 3 * g + 3]]
        mean = sum(kept) / 3
        std = (sum((r - mean) ** 2 for r in kept) / 2) ** 0.5
        expected += [0.0 if max(kept) == min(kept) else (r - mean) / (std + 1e-6) for r in kept]
    assert trained.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    last = steps[-1]
    assert last["train/group_filter/length_sampled"] == pytest.approx(sum(lengths) / len(lengths))
    assert last["train/group_filter/length_kept"] == pytest.approx(sum(lengths[i] for i in rows) / len(rows))
    assert last["train/group_filter/reward_sampled"] == pytest.approx(sum(rewards) / len(rewards))
    assert last["train/group_filter/reward_kept"] == pytest.approx(sum(rewards[i] for i in rows) / len(rows))
    assert last["train/reward_mean"] == pytest.approx(last["train/group_filter/reward_kept"])
    if metric == "length":
        assert last["train/group_filter/length_kept"] < last["train/group_filter/length_sampled"]
    if metric == "max_variance":  # no three rows of a group vary more than the kept ones, e.g. its first three
        kept, first = torch.tensor([rewards[i] for i in rows]).view(-1, 3), torch.tensor(rewards).view(-1, 6)[:, :3]
        assert (kept.var(-1) >= first.var(-1) - 1e-6).all() and (kept.var(-1) > first.var(-1) + 1e-6).any()


def test_dynamic_sampling_top_ups_are_filtered_as_the_batch_is():
    module = RLVRModule(
        policy(),
        group_size=4,
        group_filter=GroupFilterConfig(keep=2),
        dynamic_sampling=DynamicSamplingConfig(enabled=True, max_rounds=3),
        update=UpdateConfig(mini_batch_size=PROMPTS),
    )
    seen, steps = fit(module, steps=3)
    assert len(seen) > 3  # top-ups were sampled
    assert all(rollout.num_rows % 4 == 0 and rollout.group_size == 4 for rollout in seen)
    trained = module.last_rollout
    assert trained.num_rows == PROMPTS * 2 and trained.group_size == 2
    assert any(step["train/dynamic_sampling/rounds"] > 1 for step in steps)
    # every trained response is one of the two shortest of its group as sampled
    shortest = set()
    for rollout in seen:
        lengths = rollout.response_mask.sum(-1).tolist()
        shortest |= {tuple(rollout.response_ids[i].tolist()) for i in kept_by_hand([-n for n in lengths], 4, 2)}
    assert all(tuple(row.tolist()) in shortest for row in trained.response_ids)


def test_keep_equal_to_the_group_size_filters_nothing():
    plain = RLVRModule(policy(), group_size=4)
    fit(plain)
    same = RLVRModule(policy(), group_size=4, group_filter=GroupFilterConfig(keep=4))
    fit(same)
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), same.parameters(), strict=True))


def test_bad_options_name_the_option():
    with pytest.raises(OptionValueError, match="group_filter.metric='longest'"):
        GroupFilterConfig(keep=2, metric="longest")
    with pytest.raises(OptionValueError, match="group_filter.keep=0"):
        GroupFilterConfig(keep=0)
    with pytest.raises(ValueError, match="group_filter.keep=5 must be at most group_size=4"):
        RLVRModule(policy(), group_size=4, group_filter=GroupFilterConfig(keep=5))
    with pytest.raises(ValueError, match="with group_filter.keep=1 every group"):
        RLVRModule(
            policy(),
            group_size=4,
            group_filter=GroupFilterConfig(keep=1),
            dynamic_sampling=DynamicSamplingConfig(enabled=True),
        )
    module = RLVRModule(policy(), group_size=4, group_filter=GroupFilterConfig(keep=1))
    with pytest.raises(ValueError, match="RLOOAdvantage needs groups of >= 2.*group_filter.keep=1"):
        fit(module, advantage=RLOOAdvantage())
    module = RLVRModule(
        policy(), group_size=4, group_filter=GroupFilterConfig(keep=3), update=UpdateConfig(mini_batch_size=32)
    )
    with pytest.raises(ValueError, match=r"data.batch_size x group_filter.keep = 16 x 3 = 48"):
        fit(module)


COMBINATIONS = {
    "asynchronous rollouts": dict(rollout_staleness=1),
    "replay": dict(replay=ReplayConfig(size=8)),
    "epochs and prompt mini-batches": dict(update=UpdateConfig(epochs=2, mini_batch_size=8, shuffle="prompts")),
}


@pytest.mark.parametrize("name", sorted(COMBINATIONS) + ["PPOModule", "ReMax's greedy baseline"])
def test_the_filter_composes_with_the_other_options(name):
    filtering = GroupFilterConfig(keep=2, metric="token_efficiency")
    advantage = GreedyBaselineAdvantage() if name.startswith("ReMax") else None if name != "PPOModule" else False
    if name == "PPOModule":
        module = PPOModule(policy(), group_size=4, group_filter=filtering)
    else:
        module = RLVRModule(policy(), group_size=4, group_filter=filtering, **COMBINATIONS.get(name, {}))
    seen, steps = fit(module, advantage=advantage, steps=3)
    trained = module.last_rollout
    assert trained.num_rows == PROMPTS * 2 and trained.group_size == 2
    finite = [value for key, value in steps[-1].items() if not key.startswith("train/bias/")]  # NaN: none correct
    assert torch.isfinite(trained.advantages).all() and all(math.isfinite(value) for value in finite)
    assert "train/group_filter/length_kept" in steps[-1]
