"""Bounded staleness (`RLVRModule(rollout_staleness=K)`, K >= 2): a queue of rollouts, each trained on K updates
after the weights that sampled it, its staleness logged every step; rollouts older than K versions (from a
checkpoint of a larger K) are dropped or sampled again."""

from __future__ import annotations

import threading

import pytest

from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.async_rollouts import AsyncRollouts
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .async_recorders import WeightsAtStepStart, recording_policy
from .test_rlvr_module import fit


@pytest.mark.parametrize("staleness", [2, 3])
def test_the_trained_rollout_was_sampled_k_updates_back(in_tmp_dir, staleness):
    module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=staleness, update=UpdateConfig(epochs=2))
    assert module.rollout_is.mode == "token_mask"  # an off-policy correction is on unless another is chosen
    weights = WeightsAtStepStart()
    steps = staleness + 4
    trainer, recorder = fit(module, [SortInclusionOrderingReward(), weights], steps=steps)
    at_start = weights.at_start
    # the first K steps only sample (no update); then step t trains on batch t-K's rollout, sampled with the
    # weights step t-K started from
    assert weights.trained[:staleness] == [None] * staleness
    assert trainer.global_step == (steps - staleness) * 2
    assert len(set(at_start[staleness:])) >= 3  # the updates moved the weights
    for t in range(staleness, steps):
        record = weights.trained[t]
        assert record["sampled_with"] == at_start[t - staleness]
        assert record["own_generator"] and record["unchanged"]
    assert weights.trained[-1]["sampled_with"] != at_start[-1]  # stale: the live weights moved on
    # staleness in policy versions (updates made between sampling and training): 0, 1, ..., K, then K
    logged = [step.get("train/async/staleness") for step in recorder.steps]
    expected = [None] * staleness + [float(min(i, staleness)) for i in range(steps - staleness)]
    assert logged == expected
    assert {step.get("train/async/dropped") for step in recorder.steps[staleness:]} == {0.0}
    queued = [step.get("train/async/queued") for step in recorder.steps[staleness:]]
    assert queued == [float(staleness - 1)] * (steps - staleness)  # taken one, the one in flight not yet back


def _rollouts(staleness: int) -> AsyncRollouts:
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    return AsyncRollouts(policy, group_size=2, sampling=RLVRModule(policy).sampling, staleness=staleness)


def test_a_rollout_older_than_k_versions_is_sampled_again_and_counted(caplog):
    rollouts = _rollouts(2)
    first, second = {"prompt": [[1, 2, 3]]}, {"prompt": [[3, 2, 1]]}
    assert rollouts.take(first, 0) is None and rollouts.take(second, 0) is None  # the queue fills
    for _ in range(3):  # three updates: the oldest rollout is now 3 > 2 versions old
        rollouts.updated()
    with caplog.at_level("WARNING"):
        taken = rollouts.take({"prompt": [[2, 2, 2]]}, 6)
    assert taken.policy_version == 3 and rollouts.step_metrics(taken)["train/async/staleness"] == 0.0
    assert taken.rollout.prompt_ids[0].tolist() == [1, 2, 3]  # its own prompts, sampled again
    assert rollouts.dropped == 1 and "a rollout 3 versions old was dropped" in caplog.text
    assert rollouts.step_metrics(taken)["train/async/dropped"] == 1.0


def test_a_checkpoint_of_a_larger_k_keeps_the_newest_rollouts():
    larger = _rollouts(3)
    for prompt in ([1, 2, 3], [2, 3, 1], [3, 1, 2]):
        larger.take({"prompt": [prompt]}, 0)
    state = larger.state_dict()
    assert len(state["queue"]) == 3
    smaller = _rollouts(1)
    smaller.load_state_dict(state)
    assert [r.rollout.prompt_ids[0].tolist() for r in smaller.queue] == [[3, 1, 2]] and smaller.dropped == 2
    same = _rollouts(3)
    same.load_state_dict(state)
    assert [r.batch for r in same.queue] == [r.batch for r in larger.queue] and same.dropped == 0


def test_a_checkpoint_of_one_step_staleness_before_queues_loads():
    rollouts = _rollouts(1)
    rollouts.take({"prompt": [[1, 2, 3]]}, 0)
    (entry,) = rollouts.state_dict()["queue"]
    old_format = {"ready": entry["rollout"], "stats": entry["stats"], "version": entry["version"]}
    loaded = _rollouts(1)
    loaded.load_state_dict(old_format)
    assert len(loaded.queue) == 1 and loaded.queue[0].rollout.prompt_ids[0].tolist() == [1, 2, 3]


def test_a_rollout_keeps_the_policy_version_of_its_launch_when_the_update_ends_first():
    """A slow sampler (a rollout server) may finish after the update: the rollout was still sampled with the
    weights of before it, and its staleness counts that update."""
    rollouts = _rollouts(2)
    assert rollouts.take({"prompt": [[1, 2, 3]]}, 0) is None
    release = threading.Event()
    sample = rollouts._sampler.sample
    rollouts._sampler.sample = lambda *args, **kwargs: release.wait(30) and sample(*args, **kwargs)
    rollouts.launch({"prompt": [[3, 2, 1]]}, 0)
    rollouts.updated()  # the update ends while the rollout is still being sampled
    release.set()
    rollouts.wait()
    assert [queued.policy_version for queued in rollouts.queue] == [0, 0]
    assert rollouts.step_metrics(rollouts.queue[-1])["train/async/staleness"] == 1.0
