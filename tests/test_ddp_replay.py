"""The replay buffer under 2-process DDP (gloo on CPU): each rank keeps and replays its own groups, the checkpoint
holds both ranks' buffers, and a run resumed from step 4 of 8 ends bitwise where the uninterrupted run ends."""

from __future__ import annotations

import shutil

import torch

from tests.ddp_runs import fit_two_ranks
from tests.modules.test_replay_buffer import REPLAY_RUN

STEPS = 8

RECORDER = """
import json, torch
import lightning.pytorch as pl
torch.set_num_threads(1)

class ReplayRecorder(pl.Callback):
    def __init__(self, out: str):
        self.out, self.sizes = out, []
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.sizes.append(len(pl_module.replay))
    def on_train_end(self, trainer, pl_module):
        rank = trainer.global_rank
        json.dump({"sizes": self.sizes}, open(f"{self.out}/rank{rank}.json", "w"))
        torch.save(pl_module.state_dict(), f"{self.out}/rank{rank}.pt")
"""

CONFIG = (
    """
seed_everything: 0
{resume}
trainer:
  strategy: ddp
  accelerator: cpu
  devices: 2
  max_epochs: 1
  limit_train_batches: {steps}
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortDistanceReward
    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {{dirpath: {out}/ckpt, every_n_rollout_steps: 2, save_last: true, save_top_k: -1}}
    - class_path: replay_recorder.ReplayRecorder
      init_args: {{out: {out}}}
"""
    + REPLAY_RUN
)


def test_each_rank_replays_its_own_groups_and_a_resumed_run_is_bitwise_identical(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir()
    records = fit_two_ranks(
        full, "replay_recorder", RECORDER, CONFIG.format(resume="", steps=STEPS, out=full, batch_size=8)
    )
    assert all(record["sizes"][-1] > 0 for record in records)
    checkpoint = torch.load(full / "ckpt" / "epoch=0-rollout_step=4.ckpt", weights_only=False)
    ranks = checkpoint["rlvr_replay"]["ranks"]
    assert len(ranks) == 2 and all(state["entries"] for state in ranks)
    first = [[entry[3]["prompt_ids"].tolist() for entry in state["entries"]] for state in ranks]
    assert first[0] != first[1]  # each rank stored the groups of its own prompts

    (resumed / "ckpt").mkdir(parents=True)
    shutil.copy(full / "ckpt" / "epoch=0-rollout_step=4.ckpt", resumed / "ckpt" / "last.ckpt")
    resume = f"ckpt_path: {resumed / 'ckpt' / 'last.ckpt'}"
    fit_two_ranks(
        resumed, "replay_recorder", RECORDER, CONFIG.format(resume=resume, steps=STEPS, out=resumed, batch_size=8)
    )
    for rank in (0, 1):
        expected = torch.load(full / f"rank{rank}.pt", weights_only=False)
        actual = torch.load(resumed / f"rank{rank}.pt", weights_only=False)
        for key in expected:
            assert torch.equal(expected[key], actual[key]), (rank, key)
