"""SPO's value tracker in a run: the advantages against the trackers by hand, new prompts sampled once to start
theirs, the KL-adaptive forgetting from the policy's drift on each prompt's last response, checkpoints, ranks."""

import io

import pytest
import torch

from rlvr_lightning.advantages import ValueTrackerAdvantage
from rlvr_lightning.advantages import value_tracker as module_under_test
from rlvr_lightning.advantages.prompt_state import data_prompt_digest, prompt_digests
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


def token_key(prompt: list[int]) -> str:
    """The tracker's key of a sort prompt (the toy policy's prompt ids are the prompt's tokens)."""
    return prompt_digests(rollout_of([prompt], [0.0], group_size=1))[0]


def test_prioritized_sampling_draws_the_step_from_the_batch_by_the_trackers(monkeypatch):
    estimator = ValueTrackerAdvantage(prior_samples=0, rho=0.5, prioritize=2)
    estimator._step_raws = [data_prompt_digest([1, 2]), data_prompt_digest([3, 4])]
    estimator.compute(rollout_of([[1, 2], [3, 4]], [1.0, 0.0], group_size=1))  # learns the raw prompts' keys
    estimator.on_train_batch_end(None, None, None, None, 0)
    assert estimator.keys == {data_prompt_digest(p): token_key(p) for p in ([1, 2], [3, 4])}
    # (1/2, 1/2) -> (1.25, 0.25): p = 5/6 for [1, 2], 1/6 for [3, 4]; [5, 6] unknown: p = 1/2
    seen = []
    monkeypatch.setattr(tracker, "prioritized_draw", lambda weights, keep: seen.append(weights) or torch.tensor([0, 2]))
    batch = {"prompt": [[1, 2], [5, 6], [3, 4]], "metadata": [{"n": 0}, {"n": 1}, {"n": 2}]}
    estimator.on_train_batch_start(None, None, batch, 1)
    spread = (5 / 36) ** 0.5  # sqrt(p (1 - p)) for p = 5/6 and 1/6
    assert seen[0].tolist() == pytest.approx([spread + 0.05, 0.55, spread + 0.05])
    assert batch == {"prompt": [[1, 2], [3, 4]], "metadata": [{"n": 0}, {"n": 2}]}  # cut in place
    assert estimator._step_raws == [data_prompt_digest([1, 2]), data_prompt_digest([3, 4])]
    metrics = estimator.step_metrics()
    assert metrics["train/spo/drawn_std_mean"] == pytest.approx(spread)
    assert metrics["train/spo/candidate_std_mean"] == pytest.approx((2 * spread + 0.5) / 3)


def test_a_prioritized_run_trains_on_the_drawn_prompts_after_starting_every_candidates_tracker(in_tmp_dir):
    torch.manual_seed(0)
    spy = SampleSpy(vocab_size=5, prompt_length=3, embedding_dim=4)
    estimator = ValueTrackerAdvantage(prior_samples=3, rho=0.9, reward_high=7.0, prioritize=2)
    module, trainer = pool_fit(estimator, epochs=2, policy_=spy)
    calls = [(prompts, n) for prompts, n, _, _ in spy.calls]
    # the first epoch: every step starts its 4 new candidates (3 responses each), then samples 2 of them once
    for step in range(2):
        (candidates, n_prior), (drawn, n) = calls[2 * step], calls[2 * step + 1]
        assert (len(candidates), n_prior, len(drawn), n) == (4, 3, 2, 1)
        assert all(prompt in candidates for prompt in drawn) and drawn[0] != drawn[1]
    assert [(len(prompts), n) for prompts, n in calls[4:]] == [(2, 1), (2, 1)]  # then no prompt is new
    assert [rollout.num_rows for rollout in module.trained_on] == [2] * 4
    pool = [prompt for prompts, n in calls[:4] if n == 3 for prompt in prompts]
    assert estimator.keys == {data_prompt_digest(p): token_key(p) for p in pool}
    assert 0 < float(trainer.callback_metrics["train/spo/drawn_std_mean"]) <= 0.5


def test_prioritized_sampling_needs_a_larger_batch(in_tmp_dir):
    with pytest.raises(ValueError, match=r"prioritize=4 draws from each batch's prompts, and this batch holds 4"):
        pool_fit(ValueTrackerAdvantage(prior_samples=0, prioritize=4))


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
                   "primed": sorted(estimator.primed), "keys": estimator.keys},
                  open(f"{self.out}/rank{trainer.global_rank}.json", "w"))
"""


@pytest.mark.parametrize(("options", "trained"), [("prior_samples: 2", 2), ("prior_samples: 0, prioritize: 1", 1)])
def test_every_rank_holds_every_ranks_trackers_and_responses(tmp_path, options, trained):
    estimator = (
        "{class_path: rlvr_lightning.advantages.ValueTrackerAdvantage, init_args: {" + options + ", reward_high: 7}}"
    )
    config = pool_ddp_config(tmp_path, estimator, "tracker_recorder.TrackerRecorder", 1)
    records = fit_two_ranks(tmp_path, "tracker_recorder", RECORDER, config)
    assert records[0] == records[1]
    visits = sum(visits for _, _, visits in records[0]["trackers"].values())
    assert visits == 3 * 2 * trained * 2  # 3 epochs of 2 steps, `trained` prompts a rank, every rank's
    if "prioritize" in options:  # each prompt any rank trained on: its tracker, last response and key, on both
        assert len(records[0]["keys"]) == len(records[0]["trackers"]) == len(records[0]["last"]) >= 4
    else:
        assert len(records[0]["primed"]) == len(records[0]["last"]) == 8
