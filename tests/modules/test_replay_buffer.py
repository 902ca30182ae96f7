"""`replay: {size: N}`, a replay buffer of informative groups (TRL's `GRPOWithReplayBufferTrainer`): scores, the
buffer's order and draws, the refill by hand, the old log-probs a replayed group keeps, refusals, exact resume."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from rlvr_lightning.advantages import GroupNormalizedAdvantage
from rlvr_lightning.cli.app import main
from rlvr_lightning.modules import PPOModule, RLVRModule
from rlvr_lightning.modules.options import ReplayConfig
from rlvr_lightning.modules.pair_rollouts import pair_rollout
from rlvr_lightning.modules.replay_buffer import GroupReplayBuffer, group_scores
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortDistanceReward
from rlvr_lightning.runtime.option_domains import OptionValueError
from tests.modules.test_expert_iteration import fit
from tests.test_resume import logged, parameters


def toy():
    torch.manual_seed(0)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8, activation="tanh")


def rollout_of(rewards, advantages, group_size=2, old=None):
    """Rows of one prompt each; `advantages` per row, the same at each of its 3 response tokens."""
    n = len(rewards)
    rollout = pair_rollout(toy(), [[1, 2, 3]] * n, [[1, 2, 3]] * n)
    rollout.group_size = group_size
    rollout.group_index = torch.arange(n) // group_size
    rollout.reward = torch.tensor(rewards, dtype=torch.float)
    rollout.advantages = torch.tensor(advantages, dtype=torch.float)[:, None].expand(n, 3).clone()
    rollout.old_log_probs = None if old is None else torch.tensor(old, dtype=torch.float)[:, None].expand(n, 3)
    return rollout


def test_group_scores_by_hand():
    # group 0: rewards 1, 0 (sample std 1/sqrt 2), |A| 0.5 + 0.5; group 1: rewards 3, 1 (std sqrt 2), |A| 1 + 2
    rollout = rollout_of([1.0, 0.0, 3.0, 1.0], [0.5, -0.5, 1.0, -2.0])
    rollout.response_mask[3, 2] = 0  # a shorter row: its mean |A| over its own tokens stays 2
    expected = [1.0 / math.sqrt(2), 3.0 * math.sqrt(2)]
    assert group_scores(rollout).tolist() == pytest.approx(expected)
    rollout.advantages = torch.tensor([0.5, -0.5, 1.0, -2.0])  # an estimator's per-row advantages
    assert group_scores(rollout).tolist() == pytest.approx(expected)


def test_a_full_buffer_keeps_the_highest_scores_and_draws_by_score():
    buffer = GroupReplayBuffer(size=2, seed=0)
    group = rollout_of([1.0, 0.0], [1.0, -1.0])
    for score in (1.0, 3.0, 0.5, 2.0):
        buffer.add(group, score, step=0)
    assert sorted(entry[0] for entry in buffer.entries) == [2.0, 3.0]
    draws = [buffer.draw(1)[0][1] is buffer.entries[0][3] for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(2.0 / 5.0, abs=0.03)  # the entry scored 2 of 2 + 3
    assert len(buffer.draw(5)) == 5  # more than it holds: with replacement


def test_refill_by_hand():
    """Step 0: group 0 informative, group 1 flat. Group 0 enters the buffer and replaces group 1, with its own
    advantages and old log-probs. Step 3: both flat; both replaced by group 0, aged 3 steps."""
    buffer = GroupReplayBuffer(size=4)
    first = rollout_of([1.0, 0.0, 2.0, 2.0], [0.7, -0.7, 0.0, 0.0], old=[-1.0, -2.0, -3.0, -4.0])
    refilled, stats = buffer.refill(first, step=0)
    assert refilled.num_rows == 4 and refilled.num_groups == 2
    assert refilled.reward.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert refilled.advantages[:, 0].tolist() == pytest.approx([0.7, -0.7, 0.7, -0.7])
    assert refilled.old_log_probs[:, 0].tolist() == [-1.0, -2.0, -1.0, -2.0]
    assert stats == {"replaced": 1.0, "age_mean": 0.0, "size": 1.0}

    later = rollout_of([0.0, 0.0, 5.0, 5.0], [0.0, 0.0, 0.0, 0.0], old=[-9.0] * 4)
    refilled, stats = buffer.refill(later, step=3)
    assert refilled.old_log_probs[:, 0].tolist() == [-1.0, -2.0, -1.0, -2.0]
    assert stats == {"replaced": 2.0, "age_mean": 3.0, "size": 1.0}


def test_max_age_drops_groups_sampled_longer_ago():
    buffer = GroupReplayBuffer(size=4, max_age=2)
    buffer.refill(rollout_of([1.0, 0.0], [1.0, -1.0]), step=0)
    buffer.refill(rollout_of([3.0, 0.0], [1.0, -1.0]), step=1)
    flat = rollout_of([1.0, 1.0], [0.0, 0.0])
    _, stats = buffer.refill(flat, step=2)
    assert stats["size"] == 2.0 and stats["replaced"] == 1.0
    _, stats = buffer.refill(flat, step=3)  # the group of step 0 is 3 steps old: only step 1's is left
    assert stats["size"] == 1.0 and stats["age_mean"] == 2.0
    _, stats = buffer.refill(flat, step=4)
    assert stats["size"] == 0.0 and stats["replaced"] == 0.0


def test_an_empty_buffer_leaves_a_flat_rollout_as_it_is():
    flat = rollout_of([1.0, 1.0], [0.0, 0.0])
    refilled, stats = GroupReplayBuffer(size=4).refill(flat, step=0)
    assert refilled is flat and stats["replaced"] == 0.0 and math.isnan(stats["age_mean"])


def test_groups_stored_under_other_options_are_dropped():
    buffer = GroupReplayBuffer(size=4)
    buffer.refill(rollout_of([1.0, 0.0], [1.0, -1.0]), step=0)  # stored without old log-probs
    refilled, stats = buffer.refill(rollout_of([1.0, 1.0], [0.0, 0.0], old=[-1.0, -1.0]), step=1)
    assert stats["replaced"] == 0.0 and len(buffer) == 0 and refilled.old_log_probs is not None


def test_refusals_name_the_option():
    with pytest.raises(OptionValueError, match="replay.size"):
        ReplayConfig(size=-1)
    with pytest.raises(OptionValueError, match="replay.max_age"):
        ReplayConfig(size=4, max_age=-1)
    with pytest.raises(ValueError, match="group_size=1"):
        RLVRModule(toy(), group_size=1, replay=ReplayConfig(size=4))
    with pytest.raises(ValueError, match="replay does not apply to PPOModule"):
        PPOModule(toy(), replay=ReplayConfig(size=4))


STEPS = 8
# the model and data of the runs below and of tests/test_ddp_replay.py (a `str.format` template: batch_size)
REPLAY_RUN = """model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.ToySortPolicy
      init_args: {{vocab_size: 5, prompt_length: 3, embedding_dim: 8, activation: relu}}
    optimizer:
      class_path: torch.optim.Adam
      init_args: {{lr: 0.03}}
    group_size: 2
    replay: {{size: 8}}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: {batch_size}
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: 5, length: 3, num_val: 0, seed: 0}}
"""


def config(tmp_path: Path, name: str) -> Path:
    text = f"""
seed_everything: 3
trainer:
  max_epochs: 1
  limit_train_batches: {STEPS}
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {tmp_path}/logs, name: {name}}}
  callbacks:
    - class_path: rlvr_lightning.rewards.SortDistanceReward
    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {{dirpath: {tmp_path}/ckpt_{name}, every_n_rollout_steps: 2, save_last: true, save_top_k: -1}}
""" + REPLAY_RUN.format(batch_size=16)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_replayed_rows_keep_the_log_probs_of_the_policy_that_sampled_them(in_tmp_dir):
    """One update per step, where no old-log-prob pass runs without replay: at each update the fresh rows' old
    log-probs are the current policy's and the replayed rows' those of the policy that sampled them."""
    module = RLVRModule(toy(), group_size=2, replay=ReplayConfig(size=8))
    run, refill, seen = module.policy_update.run, module.replay.refill, {"stale": 0, "replayed": 0}

    def recorded_refill(rollout, step):
        refilled, stats = refill(rollout, step)
        seen["last"] = int(stats["replaced"]) * 2  # rows: the last ones of the refilled rollout
        return refilled, stats

    def checked_run(rollout, owner):
        with torch.no_grad():
            now = module.policy.token_log_probs(rollout)[0]
        same = torch.isclose(now, rollout.old_log_probs, atol=1e-6).all(dim=-1)
        replayed = seen["last"]
        assert bool(same[: rollout.num_rows - replayed].all())
        seen["stale"] += int((~same).sum())
        seen["replayed"] += replayed
        return run(rollout, owner)

    module.policy_update.run, module.replay.refill = checked_run, recorded_refill
    fit(module, [SortDistanceReward(), GroupNormalizedAdvantage()], rounds=6, val=False)
    assert seen["replayed"] > 0 and seen["stale"] > 0


def test_a_resumed_run_with_replay_is_bitwise_identical(tmp_path, monkeypatch):
    """Resumed from step 4 of 8, a run ends bitwise where the uninterrupted run ends: the buffer and its draws
    are checkpointed."""
    monkeypatch.chdir(tmp_path)
    full = main(["fit", "--config", str(config(tmp_path, "full"))])
    replaced = logged(tmp_path, "full", "train/replay/replaced")
    assert sum(float(replaced[step]) for step in range(4, STEPS)) > 0, "no replay after the resume: proves nothing"
    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0-rollout_step=4.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(config(tmp_path, "resumed")), "--ckpt_path", "last"])
    expected, actual = parameters(full.model), parameters(resumed.model)
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    for key in ("train/replay/replaced", "train/reward_mean"):
        full_log, resumed_log = logged(tmp_path, "full", key), logged(tmp_path, "resumed", key)
        assert resumed_log == {step: full_log[step] for step in range(4, STEPS)}


LENGTH_BIAS = Path(__file__).resolve().parents[2] / "configs" / "length_bias"
TINY_LM = str(LENGTH_BIAS / "grpo.yaml")
QUICK = [f"--model.init_args.policy.init_args.model.tokenizer={LENGTH_BIAS / 'digits_tokenizer'}"]
QUICK += ["--trainer.limit_train_batches=4", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
QUICK += [
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
    "--model.init_args.group_size=4",
]
QUICK += [
    "--data.init_args.batch_size=16",
    "--model.init_args.replay.size=8",
    "--model.init_args.update.mini_batch_size=32",
]


@pytest.mark.parametrize(
    "options",
    [
        [],  # varied response lengths: stored groups are padded to the step's width
        ["--model.init_args.update.micro_batch_tokens=64"],  # packed micro-batches
        ["--model.init_args.policy.init_args.lora={r: 4, alpha: 8}", "--model.init_args.kl.coef=0.01"],
        ["--model.init_args.rollout_staleness=1"],  # asynchronous rollouts
        ["--model.init_args.dynamic_sampling.enabled=true", "--model.init_args.dynamic_sampling.max_rounds=2"],
    ],
    ids=["lengths", "packed", "lora_kl", "async", "dynamic_sampling"],
)
def test_replay_runs_with_the_other_options_on_a_language_model(options, in_tmp_dir, monkeypatch):
    draw, drawn = GroupReplayBuffer.draw, []
    monkeypatch.setattr(GroupReplayBuffer, "draw", lambda self, count: drawn.append(count) or draw(self, count))
    cli = main(["fit", "--config", TINY_LM, *QUICK, *options])
    assert sum(drawn) > 0, "nothing was replayed: the test would prove nothing"
    assert cli.trainer.fit_loop.epoch_loop._batches_that_stepped == 4
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert "train/replay/size" in cli.trainer.callback_metrics
