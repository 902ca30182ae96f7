"""A real 2-process DDP run (gloo on CPU) of `rlvr fit`: ranks train on their own prompts, stay identical,
log synchronised metrics, and the difficulty filter keeps the same, exactly right, prompts on every rank.

The policy is `ScriptedSortPolicy` (tests/data/test_difficulty_filter.py): trainable toy-model
log-probs, scripted samples, so every prompt's pass rate is known.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "data"))
from test_difficulty_filter import N, V, expected_kept, scripted_passes  # noqa: E402

from rlvr_lightning.data import SortTask  # noqa: E402
from rlvr_lightning.data.prompt_streams import PromptStream, ReshuffledPool  # noqa: E402
from rlvr_lightning.data.sort_task import SortStream  # noqa: E402
from tests.ddp_runs import fit_two_ranks  # noqa: E402

STEPS, EPOCHS, BATCH, CANDIDATES = 3, 2, 8, 40

RECORDER = '''
import json, torch
import lightning.pytorch as pl
from rlvr_lightning.data.difficulty_filter import DifficultyFilter
torch.set_num_threads(1)

class RankRecorder(pl.Callback):
    """Writes what this rank saw and ended with to rank<r>.json / rank<r>.pt in `out`."""
    def __init__(self, out: str):
        self.out, self.prompts, self.kept, self.metrics, self.local = out, [], [], [], []
    def on_train_start(self, trainer, pl_module):
        self.initial = {k: v.clone() for k, v in pl_module.state_dict().items()}
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.prompts.append(batch["prompt"])
    def on_train_epoch_start(self, trainer, pl_module):
        self.kept.append([e["prompt"] for e in trainer.datamodule.difficulty_filter.kept])
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.policy.sample(batch, pl_module.group_size, pl_module.sampling)  # scripted: the same rollout
        pl_module.score(rollout)
        self.local.append([rollout.reward.mean().item(), rollout.reward.min().item(), rollout.reward.max().item()])
        keys = ("train/reward_mean", "train/reward_min", "train/reward_max")
        self.metrics.append({k: float(trainer.callback_metrics[k]) for k in keys})
    def on_train_end(self, trainer, pl_module):
        # fail_all mode under DDP, on the candidates of the last refresh
        flt = DifficultyFilter(n=trainer.datamodule.difficulty_filter.n, mode="fail_all")
        flt.refresh(pl_module, trainer.datamodule.difficulty_filter.candidates, epoch=0, seed=0,
                    rank=trainer.global_rank, world_size=trainer.world_size, trainer=trainer)
        rank = trainer.global_rank
        json.dump({"prompts": self.prompts, "kept": self.kept, "fail_all": [e["prompt"] for e in flt.kept],
                   "metrics": self.metrics, "local": self.local, "world_size": trainer.world_size,
                   "pass_counts": trainer.datamodule.difficulty_filter.pass_counts},
                  open(f"{self.out}/rank{rank}.json", "w"))
        torch.save({"final": pl_module.state_dict(), "initial": self.initial}, f"{self.out}/rank{rank}.pt")
'''

CONFIG = """
seed_everything: 0
trainer:
  strategy: ddp
  accelerator: cpu
  devices: 2
  max_epochs: {epochs}
  limit_train_batches: {steps}
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {out}, name: csv}}
  callbacks:
    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward
    - class_path: rlvr_lightning.callbacks.RolloutCheckpoint
      init_args: {{dirpath: {out}/ckpt, every_n_rollout_steps: 2, save_last: true}}
    - class_path: ddp_recorder.RankRecorder
      init_args: {{out: {out}}}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: test_difficulty_filter.ScriptedSortPolicy
      init_args: {{vocab_size: {vocab}, prompt_length: 3, embedding_dim: 8}}
    optimizer:
      class_path: torch.optim.Adam
      init_args: {{lr: 0.05}}
    group_size: {n}
    update: {{epochs: 2, mini_batch_size: 16, {micro}}}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    batch_size: {batch}
    task:
      class_path: rlvr_lightning.data.SortTask
      init_args: {{vocab_size: {vocab}, length: 3, num_val: 0}}
    difficulty_filter:
      class_path: rlvr_lightning.data.DifficultyFilter
      init_args: {{n: {n}, max_candidates: {candidates}, batch_size: 8}}
"""


# rows 6 tokens long (prompt 3 + response 3): micro-batches of 4 rows either way, formed by tokens in the second
@pytest.mark.parametrize("micro", ["micro_batch_size: 4", "micro_batch_tokens: 24"], ids=["rows", "tokens"])
def test_two_process_ddp_run(tmp_path, micro):
    config = CONFIG.format(
        epochs=EPOCHS, steps=STEPS, out=tmp_path, vocab=V, n=N, batch=BATCH, candidates=CANDIDATES, micro=micro
    )
    ranks = fit_two_ranks(tmp_path, "ddp_recorder", RECORDER, config)
    assert [r["world_size"] for r in ranks] == [2, 2]

    # parameters (policy; Adam moved them) are bitwise identical on both ranks
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for key in states[0]["final"]:
        assert torch.equal(states[0]["final"][key], states[1]["final"][key]), key
    assert not all(torch.equal(states[0]["initial"][k], v) for k, v in states[0]["final"].items())  # they moved

    # the kept set is identical on both ranks and exactly the scripted window, refresh by refresh;
    # each rank trained on its own share of the (reshuffled) kept prompts
    assert len(ranks[0]["prompts"]) == len(ranks[1]["prompts"]) == STEPS * EPOCHS
    stream = SortStream(SortTask(vocab_size=V, length=3))
    for epoch in range(EPOCHS):
        candidates = [stream.example_at(i) for i in range(epoch * CANDIDATES, (epoch + 1) * CANDIDATES)]
        kept = expected_kept(candidates, "window")
        assert ranks[0]["kept"][epoch] == ranks[1]["kept"][epoch] == kept
        pool = ReshuffledPool([{"prompt": p} for p in kept], seed=epoch + 1)  # data seed 0, refresh index epoch + 1
        for rank in (0, 1):
            share = itertools.islice(iter(PromptStream(pool, BATCH, rank, 2)), STEPS)
            expected = [prompt for batch in share for prompt in batch["prompt"]]
            assert sum(ranks[rank]["prompts"][epoch * STEPS : (epoch + 1) * STEPS], []) == expected
        assert ranks[0]["prompts"][epoch * STEPS] != ranks[1]["prompts"][epoch * STEPS]
    assert ranks[0]["pass_counts"] == [scripted_passes(c["prompt"]) for c in candidates]
    assert ranks[0]["fail_all"] == ranks[1]["fail_all"] == expected_kept(candidates, "fail_all")

    # logged metrics are reduced across ranks: mean of means, min of mins, max of maxes
    for step in range(STEPS * EPOCHS):
        (mean0, min0, max0), (mean1, min1, max1) = ranks[0]["local"][step], ranks[1]["local"][step]
        for rank in ranks:
            logged = rank["metrics"][step]
            assert abs(logged["train/reward_mean"] - (mean0 + mean1) / 2) < 1e-5
            assert logged["train/reward_min"] == min(min0, min1) and logged["train/reward_max"] == max(max0, max1)

    # rank 0 wrote the log and the checkpoint (with both ranks' RNG states)
    assert "curriculum/kept_fraction" in next(tmp_path.rglob("metrics.csv")).read_text()
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    rng = checkpoint["callbacks"]["ResumeState"]["rng_states"]
    assert len(rng) == 2 and not torch.equal(rng[0]["torch"], rng[1]["torch"])  # ranks draw their own numbers
