"""SPO's value tracker in a run: the advantages against the trackers by hand, new prompts sampled once to start
theirs, the KL-adaptive forgetting from the policy's drift on each prompt's last response, checkpoints, ranks."""

import io

import pytest
import torch

from rlvr_lightning.advantages import ValueTrackerAdvantage
from rlvr_lightning.advantages import value_tracker as module_under_test
from rlvr_lightning.advantages.prompt_state import prompt_digests
from rlvr_lightning.core import value_tracker as tracker
from rlvr_lightning.modules.options import DynamicSamplingConfig
from rlvr_lightning.rewards import SortInclusionOrderingReward
from tests.ddp_runs import fit_two_ranks

from .prompt_pool import pool_ddp_config, pool_fit, rollout_of
from .test_algorithm_options import UpdateSpy
from .test_greedy_baseline import SampleSpy
from .test_rlvr_module import fit, policy


def assert_trackers(trackers, expected):
    assert trackers.keys() == expected.keys()
    for key, (alpha, beta) in expected.items():
        assert trackers[key][:2] == pytest.approx((alpha, beta))


def test_with_a_fixed_rate_the_advantages_follow_the_trackers_by_hand(in_tmp_dir):
    estimator = ValueTrackerAdvantage(prior_samples=0, rho=0.9, reward_high=7.0)
    module, trainer = pool_fit(estimator, group_size=2)
    shadow = {}
    for rollout in module.trained_on:
        keys = prompt_digests(rollout)
        rewards = (rollout.reward.double() / 7.0).clamp(0, 1)
        values = torch.tensor([(lambda a, b: a / (a + b))(*shadow.get(k, (0.5, 0.5))) for k in keys])
        expected = tracker.single_stream_advantages(rewards, values.double().repeat_interleave(2))
        assert torch.allclose(rollout.advantages, expected.float(), atol=1e-6)
        for key, total in zip(keys, rewards.view(-1, 2).sum(-1).tolist(), strict=True):  # no prompt twice in a step
            alpha, beta = shadow.get(key, (0.5, 0.5))
            shadow[key] = (0.9 * alpha + total, 0.9 * beta + (2 - total))
    assert_trackers(estimator.trackers, shadow)
    assert sum(visits for _, _, visits in estimator.trackers.values()) == 8 * 4
    assert estimator.last == {}  # a fixed rate keeps no responses
    assert trainer.callback_metrics["train/spo/first_visit_frac"] == 0.0  # the last epoch: every prompt seen


def test_each_new_prompt_is_sampled_once_to_start_its_tracker(in_tmp_dir):
    torch.manual_seed(0)
    spy = SampleSpy(vocab_size=5, prompt_length=3, embedding_dim=4)
    estimator = ValueTrackerAdvantage(prior_samples=3, rho=0.9, reward_high=7.0)
    module, _ = pool_fit(estimator, epochs=2, policy_=spy)
    priors = [(prompts, rollout) for prompts, n, _, rollout in spy.calls if n == 3]
    assert sorted(len(prompts) for prompts, _ in priors) == [4, 4]  # the pool's 8 prompts, once each
    shadow = {}
    for prompts, rollout in priors:
        successes = (SortInclusionOrderingReward()(rollout).double() / 7.0).view(len(prompts), 3).sum(-1)
        alpha, beta = tracker.initial_tracker(successes, 3, 0.875)
        shadow.update(zip(prompt_digests(rollout), zip(alpha.tolist(), beta.tolist(), strict=True), strict=True))
    for rollout in module.trained_on:  # the trained steps start from those trackers
        keys = prompt_digests(rollout)
        rewards = (rollout.reward.double() / 7.0).clamp(0, 1)
        values = torch.tensor([shadow[k][0] / sum(shadow[k]) for k in keys], dtype=torch.float64)
        assert torch.allclose(rollout.advantages, tracker.single_stream_advantages(rewards, values).float(), atol=1e-6)
        for key, reward in zip(keys, rewards.tolist(), strict=True):
            alpha, beta = shadow[key]
            shadow[key] = (0.9 * alpha + reward, 0.9 * beta + 1 - reward)
    assert_trackers(estimator.trackers, shadow)
    assert len(estimator.primed) == 8


def test_kl_adaptive_forgetting_reads_the_drift_on_the_last_response(monkeypatch):
    estimator = ValueTrackerAdvantage(prior_samples=0, rho=None)
    calls = []

    def log_probs(pl_module, rollout):
        calls.append(rollout)
        return torch.full(rollout.response_ids.shape, -1.0 * len(calls))  # -1, then -2, then -3

    monkeypatch.setattr(module_under_test, "_policy_log_probs", log_probs)
    first = rollout_of([[1, 2], [3, 4]], [1.0, 0.0], group_size=1)
    estimator.compute(first)
    estimator.on_train_batch_end(None, None, None, None, 0)
    # no earlier response: D = 0, rho = clip(1, 0.875, 0.96) = 0.96 from alpha = beta = 1/2
    key_12, key_34 = prompt_digests(first)
    assert estimator.trackers[key_12] == pytest.approx((0.96 * 0.5 + 1, 0.96 * 0.5, 1))
    assert estimator.last[key_12]["log_probs"].tolist() == [-1.0]
    second = rollout_of([[1, 2]], [0.0], group_size=1)
    advantages = estimator.compute(second)
    assert advantages.tolist() == [0.0]  # one response: nothing to normalise against
    estimator.on_train_batch_end(None, None, None, None, 1)
    # the current response scored (-2), then the last one (-3 now against -1 then): D = 2, rho = 0.875
    assert [c.num_rows for c in calls] == [2, 1, 1]
    assert torch.equal(calls[2].response_ids, first.response_ids[:1])
    alpha, beta, _ = (0.96 * 0.5 + 1, 0.96 * 0.5, 1)
    assert estimator.trackers[key_12] == pytest.approx((0.875 * alpha, 0.875 * beta + 1, 2))
    assert estimator.last[key_12]["log_probs"].tolist() == [-2.0]
    assert estimator.step_metrics()["train/spo/value_mean"] == pytest.approx(alpha / (alpha + beta))


def test_a_kl_adaptive_run_keeps_each_prompts_last_response_with_its_log_probs(in_tmp_dir):
    estimator = ValueTrackerAdvantage(prior_samples=2, reward_high=7.0)
    module, trainer = pool_fit(estimator)
    assert len(estimator.last) == 8
    last_step = module.trained_on[-1]
    for key, row in zip(prompt_digests(last_step), range(last_step.num_rows), strict=True):
        record = estimator.last[key]
        assert torch.equal(record["response"], last_step.response_ids[row])
        now = module.policy.token_log_probs(last_step.select(torch.tensor([row])), 1.0)[0].detach()
        assert torch.allclose(record["log_probs"], now[0])  # the policy after the step that sampled it
    assert 0.875 <= float(trainer.callback_metrics["train/spo/rho_mean"]) <= 0.96


def test_a_prompt_twice_in_one_step_is_counted_twice_in_order():
    estimator = ValueTrackerAdvantage(prior_samples=0, rho=0.5)
    step = rollout_of([[1, 2], [3, 4], [1, 2]], [1.0, 0.0, 0.0], group_size=1)
    estimator.compute(step)
    estimator.on_train_batch_end(None, None, None, None, 0)
    key_12 = prompt_digests(step)[0]
    # (1/2, 1/2) -> (0.5 * 0.5 + 1, 0.5 * 0.5) = (1.25, 0.25) -> (0.625, 0.125 + 1)
    assert estimator.trackers[key_12] == pytest.approx((0.625, 1.125, 2))


def test_the_state_survives_a_checkpoint(monkeypatch):
    estimator = ValueTrackerAdvantage(prior_samples=0)
    monkeypatch.setattr(module_under_test, "_policy_log_probs", lambda _, r: torch.zeros(r.response_ids.shape))
    estimator.compute(rollout_of([[1, 2], [3, 4]], [1.0, 0.0], group_size=1))
    estimator.on_train_batch_end(None, None, None, None, 0)
    buffer = io.BytesIO()
    torch.save(estimator.state_dict(), buffer)
    buffer.seek(0)
    restored = ValueTrackerAdvantage(prior_samples=0)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.trackers == estimator.trackers
    assert restored.last.keys() == estimator.last.keys()
    for key, record in estimator.last.items():
        for name, value in record.items():
            assert (value is None and restored.last[key][name] is None) or torch.equal(value, restored.last[key][name])
    step = rollout_of([[3, 4], [5, 6]], [0.5, 1.0], group_size=1)
    assert torch.equal(restored.compute(step), estimator.compute(step))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(rho_min=0.97), "rho_min=0.97 must be <= rho_max=0.96"),
        (dict(reward_high=0.0), "reward_high=0.0 must be > reward_low=0.0"),
        (dict(rho=1.5), "rho"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        ValueTrackerAdvantage(**options)


def test_sampling_new_prompts_refuses_dynamic_sampling(in_tmp_dir):
    module = UpdateSpy(policy(), group_size=2, dynamic_sampling=DynamicSamplingConfig(enabled=True))
    with pytest.raises(ValueError, match="ValueTrackerAdvantage samples the policy on each prompt met for the first"):
        fit(module, [SortInclusionOrderingReward(), ValueTrackerAdvantage(prior_samples=2)], steps=1)


RECORDER = """
import json
import lightning.pytorch as pl
import torch
torch.set_num_threads(1)

class TrackerRecorder(pl.Callback):
    def __init__(self, out: str):
        self.out = out
    def on_train_end(self, trainer, pl_module):
        estimator = pl_module.advantage_estimator
        json.dump({"trackers": {k: list(v) for k, v in estimator.trackers.items()}, "last": sorted(estimator.last),
                   "primed": sorted(estimator.primed)}, open(f"{self.out}/rank{trainer.global_rank}.json", "w"))
"""


def test_every_rank_holds_every_ranks_trackers_and_responses(tmp_path):
    estimator = (
        "{class_path: rlvr_lightning.advantages.ValueTrackerAdvantage, init_args: {prior_samples: 2, reward_high: 7}}"
    )
    config = pool_ddp_config(tmp_path, estimator, "tracker_recorder.TrackerRecorder", 1)
    records = fit_two_ranks(tmp_path, "tracker_recorder", RECORDER, config)
    assert records[0] == records[1]
    assert len(records[0]["primed"]) == len(records[0]["last"]) == 8
    assert sum(visits for _, _, visits in records[0]["trackers"].values()) == 3 * 8  # every rank's prompts
