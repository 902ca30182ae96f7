"""Asynchronous rollouts (`RLVRModule(rollout_staleness=1)`): which weights sampled the trained rollout, the
overlap of generation and update, the decoupled loss by hand, and the options."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.async_rollouts import AsyncRollouts
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, UpdateConfig
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .async_recorders import RecordingPolicy, WeightsAtStepStart, recording_policy
from .test_rlvr_module import fit


@pytest.mark.parametrize("staleness", [0, 1])
def test_the_trained_rollout_was_sampled_by_the_weights_one_update_back(in_tmp_dir, staleness):
    module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=staleness, update=UpdateConfig(epochs=2))
    weights = WeightsAtStepStart()
    trainer, recorder = fit(module, [SortInclusionOrderingReward(), weights], steps=5)
    at_start = weights.at_start
    if staleness == 0:
        assert len(set(at_start)) >= 4  # the updates moved the weights (the first one had no informative group)
        assert all(record["sampled_with"] == at_start[t] for t, record in enumerate(weights.trained))
        assert not any(record["background"] or record["own_generator"] for record in weights.trained)
        assert trainer.global_step == 5 * 2
        return
    # step 0 samples the rollout of batch 0 and makes no update; step t trains on batch t-1's rollout,
    # sampled with the weights step t-1 started from: W_{t-1}, the weights before step t-1's update
    assert weights.trained[0] is None and trainer.global_step == 4 * 2
    assert at_start[1] == at_start[0] and len(set(at_start[1:])) == 4
    for t in range(1, 5):
        record = weights.trained[t]
        assert record["sampled_with"] == at_start[t - 1]
        assert t == 1 or record["sampled_with"] != at_start[t]  # stale: the live weights moved on
        assert record["own_generator"] and record["unchanged"]
    assert [record["background"] for record in weights.trained[1:]] == [
        False,
        True,
        True,
        True,
    ]  # step 0 sampled in the main thread
    lags = [step.get("train/async/policy_lag") for step in recorder.steps]
    assert lags == [None, 0.0, 2.0, 2.0, 2.0]  # optimizer steps between sampling and training weights


def test_generation_runs_beside_the_update_on_weights_that_do_not_change(in_tmp_dir, monkeypatch):
    steps = [0]
    overlap = {"steps": steps, "launched_at": -1}
    launch = AsyncRollouts.launch

    def recording_launch(self, batch, version):
        overlap["launched_at"] = steps[0]
        return launch(self, batch, version)

    monkeypatch.setattr(AsyncRollouts, "launch", recording_launch)
    monkeypatch.setattr(RecordingPolicy, "overlap", overlap)
    hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: steps.__setitem__(0, steps[0] + 1))
    try:
        module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=1, update=UpdateConfig(epochs=2))
        weights = WeightsAtStepStart()
        fit(module, [SortInclusionOrderingReward(), weights], steps=4)
    finally:
        hook.remove()
    background = [record for record in weights.trained if record is not None and record["background"]]
    assert len(background) == 2  # the rollouts of batches 1 and 2, sampled during the updates of steps 1 and 2
    assert all(record["overlapped"] for record in background)  # an optimizer step happened while each sampled
    assert all(record["unchanged"] for record in background)  # ... and the sampler's weights did not move


def test_decoupled_loss_by_hand():
    """loss_t = -w_t * min(r_t A, clip(r_t) A), r = pi_theta / pi_prox, w = pi_prox / pi_behav, 0 above the cap
    (AReaL's decoupled PPO; rollout_staleness=1 defaults to rollout_is.mode='token_mask', cap rollout_is.max=2)."""
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4),
        rollout_staleness=1,
        aggregation=AggregationConfig(mode="token-mean"),
    )
    assert module.rollout_is.mode == "token_mask"
    rollout = module.policy.sample({"prompt": [[1, 2, 3]]}, n=2, sampling=module.sampling)
    log_probs, _ = module.policy.token_log_probs(rollout)
    log_probs = log_probs.detach()
    # row 0 (A = +1): r = 1.1 (inside the clip range 0.8..1.2), w = 1.5, 1.5, 3 (above the cap: masked)
    # row 1 (A = -1): r = 1.3 (clipped above, but A < 0 takes the unclipped -1.3), w = 0.5 for every token
    ratio = torch.tensor([[1.1] * 3, [1.3] * 3])
    weight = torch.tensor([[1.5, 1.5, 3.0], [0.5, 0.5, 0.5]])
    rollout.old_log_probs = log_probs - ratio.log()
    rollout.sampling_log_probs = rollout.old_log_probs - weight.log()
    rollout.advantages = torch.tensor([1.0, -1.0])
    loss = module.policy_update.micro_batch_loss(rollout, None, MiniBatchSizes(2, 6), first_epoch=True).loss
    # token losses: row 0: -1.5 * 1.1, -1.5 * 1.1, 0; row 1: -0.5 * min(-1.3, -1.2) = 0.65 each; token-mean over 6
    expected = (2 * (-1.5 * 1.1) + 0.0 + 3 * 0.65) / 6
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_one_update_per_step_uses_its_own_log_probs_as_the_proximal_policy():
    """With one update per step the trainer's current log-probs are pi_prox: r = 1 and w = pi_theta / pi_behav."""
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4), rollout_staleness=1, loss="ppo_clip"
    )
    rollout = module.policy.sample({"prompt": [[1, 2, 3], [0, 4, 2]]}, n=2, sampling=module.sampling)
    rollout.sampling_log_probs, rollout.old_log_probs = rollout.old_log_probs - math.log(1.25), None
    rollout.advantages = torch.tensor([1.0, -1.0, 0.5, 2.0])
    module.policy_update.add_old_and_reference_log_probs(rollout)
    assert rollout.old_log_probs is None  # one update: no forward pass for the old log-probs
    loss = module.policy_update.micro_batch_loss(rollout, None, MiniBatchSizes(4, 12), first_epoch=True).loss
    log_probs, _ = module.policy.token_log_probs(rollout)
    expected = aggregate_loss(
        -1.25 * rollout.advantages[:, None] * torch.ones_like(log_probs),
        None,
        module.aggregation.mode,
        num_sequences=4,
        num_tokens=12,
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_several_updates_recompute_the_old_log_probs_at_the_current_weights():
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4),
        rollout_staleness=1,
        update=UpdateConfig(epochs=2),
    )
    rollout = module.policy.sample({"prompt": [[1, 2, 3]]}, n=2, sampling=module.sampling)
    rollout.sampling_log_probs, rollout.old_log_probs = rollout.old_log_probs - 0.3, None
    module.policy_update.add_old_and_reference_log_probs(rollout)
    current, _ = module.policy.token_log_probs(rollout)
    torch.testing.assert_close(rollout.old_log_probs, current.detach())  # pi_prox, not the behaviour log-probs


def test_rollout_staleness_options():
    policy = ToySortPolicy(vocab_size=5, prompt_length=3)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=rf"rollout_staleness={bad!r} is not valid; choose an integer K >= 0"):
            RLVRModule(policy, rollout_staleness=bad)
    assert RLVRModule(policy, rollout_staleness=3).async_rollouts.staleness == 3
    assert (
        RLVRModule(
            policy, rollout_staleness=1, rollout_is=ImportanceSamplingConfig(mode="token_truncate")
        ).rollout_is.mode
        == "token_truncate"
    )
    assert RLVRModule(policy).rollout_is.mode is None and RLVRModule(policy).async_rollouts is None

    class OldPolicy(ToySortPolicy):
        def sample(self, batch, n, sampling):
            return super().sample(batch, n, sampling)

    with pytest.raises(TypeError, match=r"OldPolicy.sample\(batch, n, sampling\) needs a `generator` argument"):
        RLVRModule(OldPolicy(vocab_size=5, prompt_length=3), rollout_staleness=1)


def test_what_the_sampler_computed_becomes_the_behaviour_log_probs():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollouts = AsyncRollouts(policy, group_size=2, sampling=RLVRModule(policy).sampling)
    rollout = rollouts.sample_now({"prompt": [[1, 2, 3]]}, version=0).rollout
    assert rollout.old_log_probs is None  # the trainer's own, at the weights it trains from, come later
    torch.testing.assert_close(rollout.sampling_log_probs, policy.token_log_probs(rollout)[0].detach())


def test_the_update_holds_the_global_random_lock_and_the_wait_does_not(in_tmp_dir, monkeypatch):
    """A decoding step compiling in the rollout thread must not span the update's draws (`torch.compile` puts the
    global generators back when it ends): the update holds `GLOBAL_RANDOM_LOCK`, the wait for the rollout (which
    may be compiling) does not."""
    from rlvr_lightning.modules.update.policy_update import PolicyUpdate
    from rlvr_lightning.runtime.global_random import GLOBAL_RANDOM_LOCK

    held = {"update": [], "wait": []}
    run, wait = PolicyUpdate.run, AsyncRollouts.wait

    def recording_run(self, *args, **kwargs):
        held["update"].append(GLOBAL_RANDOM_LOCK._is_owned())
        return run(self, *args, **kwargs)

    def recording_wait(self):
        held["wait"].append(GLOBAL_RANDOM_LOCK._is_owned())
        return wait(self)

    monkeypatch.setattr(PolicyUpdate, "run", recording_run)
    monkeypatch.setattr(AsyncRollouts, "wait", recording_wait)
    module = RLVRModule(recording_policy(), group_size=4, rollout_staleness=1)
    fit(module, [SortInclusionOrderingReward()], steps=3)
    assert held["update"] == [True, True] and held["wait"] and not any(held["wait"])
    assert not GLOBAL_RANDOM_LOCK._is_owned()
