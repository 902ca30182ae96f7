"""A real 2-process DDP run (gloo on CPU) of `rlvr fit` with `data.retire_solved` (ScaleRL's no-positive-resampling):
both ranks retire exactly the scripted solved prompts, the same on each, and no later epoch draws one.

The policy is `ScriptedSortPolicy` (tests/data/test_difficulty_filter.py): scripted samples, so every prompt's
pass rate is known.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "data"))
from test_difficulty_filter import N, V, scripted_passes  # noqa: E402

from rlvr_lightning.data import SortTask  # noqa: E402
from tests.ddp_runs import fit_two_ranks  # noqa: E402

POOL, BATCH, EPOCHS, THRESHOLD = 32, 4, 3, 0.75

RECORDER = """
import json
import lightning.pytorch as pl

class RankRecorder(pl.Callback):
    def __init__(self, out: str):
        self.out, self.batches, self.logged = out, [], []
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append([trainer.current_epoch, [m["dataset_index"] for m in batch["metadata"]]])
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.logged.append(float(trainer.callback_metrics["train/retired_prompts"]))
    def on_train_end(self, trainer, pl_module):
        retired = {str(k): v for k, v in trainer.datamodule.retirement.retired.items()}
        json.dump({"batches": self.batches, "logged": self.logged, "retired": retired},
                  open(f"{self.out}/rank{trainer.global_rank}.json", "w"))
"""

CONFIG = """
seed_everything: 0
trainer:
  strategy: ddp
  accelerator: cpu
  devices: 2
  max_epochs: {epochs}
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  logger: false
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - class_path: retire_recorder.RankRecorder
      init_args: {{out: {out}}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: test_difficulty_filter.ScriptedSortPolicy
      init_args: {{vocab_size: {vocab}, prompt_length: 3, embedding_dim: 8}}
    group_size: {n}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: {batch}
    retire_solved: {threshold}
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: {vocab}, length: 3, num_val: 0, num_train: {pool}}}
"""


def test_two_ranks_retire_the_same_solved_prompts(tmp_path):
    config = CONFIG.format(epochs=EPOCHS, out=tmp_path, vocab=V, n=N, batch=BATCH, threshold=THRESHOLD, pool=POOL)
    ranks = fit_two_ranks(tmp_path, "retire_recorder", RECORDER, config)

    pool = [
        example["prompt"] for example in SortTask(vocab_size=V, length=3, num_val=0, num_train=POOL).train_dataset()
    ]
    solved = {i for i, prompt in enumerate(pool) if scripted_passes(prompt) / N >= THRESHOLD}
    assert 0 < len(solved) < POOL - 2 * BATCH
    # every prompt is drawn in epoch 0 (4 global batches of 2 x 4) and the solved ones are retired there, on both ranks
    assert ranks[0]["retired"] == ranks[1]["retired"] == {str(i): 0 for i in sorted(solved)}
    assert ranks[0]["logged"] == ranks[1]["logged"] and ranks[0]["logged"][-1] == len(solved)
    batches = [
        [b for b in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True) if b[0][0] == e] for e in range(3)
    ]
    assert sorted(i for pair in batches[0] for _, indices in pair for i in indices) == list(range(POOL))
    for epoch in (1, 2):  # the prompts left, in global batches of 2 x 4, each rank its own share
        assert len(batches[epoch]) == (POOL - len(solved)) // (2 * BATCH)
        drawn = [i for pair in batches[epoch] for _, indices in pair for i in indices]
        assert len(set(drawn)) == len(drawn) and not set(drawn) & solved
