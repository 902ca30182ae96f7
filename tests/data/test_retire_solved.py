"""`RLVRDataModule(retire_solved=...)`: ScaleRL's no-positive-resampling (Khatri et al. 2025, sec. 3.2).

A scripted policy solves each of eight prompts a known number of times out of ten, so which prompts are
retired (pass rate >= 0.9), when, and what every later epoch draws are worked out by hand.
"""

from __future__ import annotations

import csv
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.callbacks import RolloutCheckpoint
from rlvr_lightning.data import DifficultyFilter, InlineTask, RLVRDataModule, SortTask
from rlvr_lightning.data.prompt_streams import ReshuffledPool
from rlvr_lightning.data.retire_solved import PROMPT_INDEX_KEY, Retirement, prompt_pass_counts
from rlvr_lightning.modules import ExpertIterationModule, RLVRModule
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward
from rlvr_lightning.rollout import Rollout

V, L, G = 5, 3, 10
PROMPTS = [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1], [0, 2, 4], [1, 3, 0], [2, 4, 1]]
PASSES = [10, 9, 8, 0, 5, 10, 3, 7]  # correct responses out of G = 10, per prompt
SOLVED = {0, 1, 5}  # pass rate >= 0.9 (9 of 10 exactly at the threshold retires; 8 of 10 does not)
ACTIVE = [2, 3, 4, 6, 7]


class TablePolicy(ToySortPolicy):
    """A ToySortPolicy whose samples are scripted: `passes[prompt]` of the n responses are the sorted prompt
    (correct), the others [V-1, 0, V-1] (never sorted)."""

    passes = {tuple(p): k for p, k in zip(PROMPTS, PASSES, strict=True)}

    @torch.no_grad()
    def sample(self, batch, n, sampling):
        rows = []
        for prompt in batch["prompt"]:
            k = self.passes.get(tuple(prompt), 0)
            rows.extend(sorted(prompt) if j < k else [self.vocab_size - 1, 0, self.vocab_size - 1] for j in range(n))
        count, metadata = len(rows), batch["metadata"]
        return Rollout(
            prompt_ids=torch.as_tensor(batch["prompt"], dtype=torch.long).repeat_interleave(n, dim=0),
            prompt_mask=torch.ones(count, self.prompt_length, dtype=torch.long),
            response_ids=torch.tensor(rows, dtype=torch.long),
            response_mask=torch.ones(count, self.response_length),
            group_index=torch.arange(len(batch["prompt"])).repeat_interleave(n),
            group_size=n,
            truncated=torch.zeros(count, dtype=torch.bool),
            metadata=[m for m in metadata for _ in range(n)],
        )


class Recorder(pl.Callback):
    def __init__(self):
        self.batches = []  # (epoch, prompts, their dataset indices)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        indices = [m[PROMPT_INDEX_KEY] for m in batch["metadata"]]
        self.batches.append((trainer.current_epoch, [tuple(p) for p in batch["prompt"]], indices))


def task() -> InlineTask:
    return InlineTask([{"prompt": p} for p in PROMPTS], repeat=False)


def fit(tmp_path, epochs=3, batch_size=2, ckpt_path=None, name="run", checkpoints=False, **data_options):
    pl.seed_everything(0)
    torch.manual_seed(0)
    module = RLVRModule(TablePolicy(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=G)
    data = RLVRDataModule(task(), batch_size=batch_size, **{"retire_solved": 0.9, **data_options})
    recorder = Recorder()
    callbacks = [SortInclusionOrderingReward(), recorder]
    if checkpoints:
        callbacks.append(RolloutCheckpoint(dirpath=tmp_path / "ckpt", every_n_rollout_steps=1, save_top_k=-1))
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=pl.loggers.CSVLogger(tmp_path, name=name),
        enable_checkpointing=checkpoints,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        limit_val_batches=0,
        callbacks=callbacks,
    )
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return trainer, data, recorder


def logged_retired(tmp_path, name="run") -> list[float]:
    rows = csv.DictReader(open(next((Path(tmp_path) / name).rglob("metrics.csv"))))
    return [float(r["train/retired_prompts"]) for r in rows if r.get("train/retired_prompts")]


def test_solved_prompts_are_retired_and_never_drawn_again(tmp_path):
    trainer, data, recorder = fit(tmp_path)
    epochs = [[e for e, _, _ in recorder.batches].count(k) for k in range(3)]
    assert epochs == [4, 2, 2]  # 8 prompts, then 5 left: 2 batches of 2 (the fifth waits for a later pass)
    for _, prompts, indices in recorder.batches:
        assert [PROMPTS.index(list(p)) for p in prompts] == indices  # every prompt carries its dataset index
    drawn = [[i for e, _, ids in recorder.batches if e == k for i in ids] for k in range(3)]
    assert sorted(drawn[0]) == list(range(8))  # the first pass: every prompt once
    for k in (1, 2):  # later passes: the prompts not retired, in the order of a shuffle seeded by (seed 0, epoch)
        order = ReshuffledPool(ACTIVE, seed=k)
        assert drawn[k] == [order[i] for i in range(4)] and not set(drawn[k]) & SOLVED
    assert drawn[1] != drawn[2]
    assert data.retirement.retired == {i: 0 for i in SOLVED}  # retired in epoch 0, where each was drawn
    # the count after each step of epoch 0: the solved prompts drawn so far
    seen, expected = set(), []
    for _, _, indices in recorder.batches:
        seen |= set(indices) & SOLVED
        expected.append(float(len(seen)))
    assert logged_retired(tmp_path) == expected


def test_worker_processes_draw_the_same_passes(tmp_path):
    _, _, in_process = fit(tmp_path, name="in_process")
    _, _, in_worker = fit(tmp_path, name="in_worker", num_workers=1)  # the worker gets each epoch's pass afresh
    assert in_worker.batches == in_process.batches


def test_retirement_boundary_and_sums():
    retirement = Retirement(0.9)
    counts = torch.tensor([[3, 9, 10], [4, 8, 10], [5, 17, 20], [6, 4, 5], [6, 5, 5]])
    assert retirement.record(counts, epoch=2) == 2 and retirement.retired == {3: 2, 6: 2}  # 9/10; 6: (4+5)/(5+5)
    assert retirement.active(8, 2) == list(range(8)) and retirement.active(8, 3) == [0, 1, 2, 4, 5, 7]
    assert retirement.record(torch.tensor([[3, 10, 10]]), epoch=3) == 0 and retirement.retired[3] == 2  # once
    exact = Retirement(0.56)  # 0.56 * 25 is 14.000000000000002 in floats: 14 of 25 must still retire
    assert exact.record(torch.tensor([[0, 14, 25], [1, 13, 25]]), epoch=0) == 1 and exact.retired == {0: 0}


def test_pass_counts_per_prompt_of_a_rollout():
    policy = TablePolicy(vocab_size=V, prompt_length=L, embedding_dim=4)
    batch = {"prompt": [PROMPTS[1], PROMPTS[2]], "metadata": [{PROMPT_INDEX_KEY: 1}, {PROMPT_INDEX_KEY: 2}]}
    rollout = policy.sample(batch, G, None)
    correct = SortInclusionOrderingReward().is_correct(rollout, None)
    assert prompt_pass_counts(rollout, correct).tolist() == [[1, 9, 10], [2, 8, 10]]
    rollout.metadata = [{} for _ in rollout.metadata]
    with pytest.raises(ValueError, match="no 'dataset_index'"):
        prompt_pass_counts(rollout, correct)


@pytest.mark.parametrize("stop_after", [2, 4, 5], ids=["mid-epoch-0", "epoch-0-end", "mid-epoch-1"])
def test_a_resumed_run_draws_what_the_uninterrupted_one_draws(tmp_path, stop_after):
    _, full_data, full = fit(tmp_path, name="full", checkpoints=True)
    checkpoint = next((tmp_path / "ckpt").glob(f"*rollout_step={stop_after}.ckpt"))
    saved = torch.load(checkpoint, weights_only=False)["RLVRDataModule"]
    retired_before = set(saved["retirement"]["retired"])
    if stop_after == 2:  # the checkpoint holds some of epoch 0's retirements, not all
        assert retired_before and retired_before < SOLVED
    _, data, resumed = fit(tmp_path / "resumed", name="resumed", ckpt_path=checkpoint, checkpoints=True)
    assert resumed.batches == full.batches[stop_after:]
    assert data.retirement.retired == full_data.retirement.retired


def test_topups_come_from_the_prompts_not_retired():
    data = RLVRDataModule(task(), batch_size=2, retire_solved=0.9)
    data.retirement.retired = {0: -1, 3: -1}  # retired before epoch 0
    drawn = [i for _ in range(12) for i in (m[PROMPT_INDEX_KEY] for m in data.topup_batch()["metadata"])]
    assert set(drawn) == {1, 2, 4, 5, 6, 7}
    state = data.state_dict()
    resumed = RLVRDataModule(task(), batch_size=2, retire_solved=0.9)
    resumed.load_state_dict(state)
    assert resumed.topup_batch() == data.topup_batch()


def test_a_solved_training_set_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(TablePolicy, "passes", {tuple(p): G for p in PROMPTS})
    with pytest.raises(RuntimeError, match=r"retire_solved=0.9 has retired 8 of the 8 training prompts before epoch 1"):
        fit(tmp_path, epochs=2)


def test_option_errors(tmp_path):
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"retire_solved"):
            RLVRDataModule(task(), retire_solved=bad)
    with pytest.raises(ValueError, match=r"retire_solved=0.9 cannot be combined with data.difficulty_filter"):
        RLVRDataModule(task(), retire_solved=0.9, difficulty_filter=DifficultyFilter())
    module = RLVRModule(TablePolicy(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=G)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    endless = RLVRDataModule(SortTask(vocab_size=V, length=L, num_val=0), retire_solved=0.9)
    with pytest.raises(
        ValueError, match=r"retire_solved=0.9 needs a finite training dataset: SortTask's is an endless"
    ):
        trainer.fit(module, endless)
    with pytest.raises(ValueError, match=r"batch_size=16 is not valid: the task has 8 training prompt"):
        trainer.fit(module, RLVRDataModule(task(), batch_size=16, retire_solved=0.9))  # too small before any retires
    expert = ExpertIterationModule(TablePolicy(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=G)
    with pytest.raises(ValueError, match=r"needs a module that reports its prompts' pass rates"):
        trainer.fit(expert, RLVRDataModule(task(), batch_size=2, retire_solved=0.9))
