"""The difficulty filter keeps exactly the prompts whose pass rate is in the window (or 0 in fail_all mode).

`ScriptedSortPolicy` answers prompt p correctly in exactly `passes(p)` of its n responses, so
every pass rate is known in advance. `tests/test_ddp.py` runs it under DDP as well.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.data.difficulty_filter import DifficultyFilter
from rlvr_lightning.data.prompt_streams import PromptStream, example_source
from rlvr_lightning.data.sort_task import SortStream
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortDistanceReward, SortInclusionOrderingReward
from rlvr_lightning.rollout import Rollout

V, L, N = 5, 3, 4


def scripted_passes(prompt: list[int], n: int = N) -> int:
    """How many of the n responses to `prompt` are correct: 0..n, spread over the prompts."""
    return (prompt[0] * 7 + prompt[1] * 3 + prompt[2]) % (n + 1)


class ScriptedSortPolicy(ToySortPolicy):
    """A ToySortPolicy (trainable: its log-probs are the toy model's) whose samples are scripted:
    response j to prompt p is the sorted prompt when j < scripted_passes(p), else [V-1, 0, V-1]
    (wrong, and scoring at most 4 of 5 on the inclusion-ordering reward)."""

    @torch.no_grad()
    def sample(self, batch, n, sampling):
        prompts = torch.as_tensor(batch["prompt"], dtype=torch.long)
        rows = []
        for prompt in batch["prompt"]:
            right, k = sorted(prompt), scripted_passes(prompt, n)
            rows.extend(right if j < k else [self.vocab_size - 1, 0, self.vocab_size - 1] for j in range(n))
        count = len(rows)
        metadata = batch.get("metadata") or [{} for _ in batch["prompt"]]
        return Rollout(
            prompt_ids=prompts.repeat_interleave(n, dim=0),
            prompt_mask=torch.ones(count, self.prompt_length, dtype=torch.long),
            response_ids=torch.tensor(rows, dtype=torch.long),
            response_mask=torch.ones(count, self.response_length),
            group_index=torch.arange(len(prompts)).repeat_interleave(n),
            group_size=n,
            truncated=torch.zeros(count, dtype=torch.bool),
            metadata=[m for m in metadata for _ in range(n)],
        )


def expected_kept(candidates, mode: str, low: float = 0.0, high: float = 1.0, n: int = N) -> list[list[int]]:
    if mode == "fail_all":
        return [c["prompt"] for c in candidates if scripted_passes(c["prompt"], n) == 0]
    return [c["prompt"] for c in candidates if low < scripted_passes(c["prompt"], n) / n < high]


def module_with_rewards(*rewards) -> RLVRModule:
    torch.manual_seed(0)
    module = RLVRModule(ScriptedSortPolicy(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=N)
    module.reward_callbacks = list(rewards)
    return module


def candidates(count: int = 200) -> list[dict]:
    stream = SortStream(SortTask(vocab_size=V, length=L, seed=0))
    return [stream.example_at(i) for i in range(count)]


@pytest.mark.parametrize(
    "mode, low, high, pass_options",
    [
        ("window", 0.0, 1.0, {}),  # default criterion: the task reward's is_correct (exact sort)
        ("window", 0.3, 0.8, {"pass_reward": "sort_distance", "pass_reward_max": 3.0}),
        ("window", 0.0, 1.0, {"pass_threshold": 5.0}),  # total reward: inclusion-ordering, maximum 5
        ("fail_all", 0.0, 1.0, {}),
    ],
    ids=["window-is_correct", "window-0.3-0.8-named_reward", "window-threshold", "fail_all"],
)
def test_keeps_exactly_the_prompts_with_pass_rates_in_the_window(mode, low, high, pass_options):
    module = module_with_rewards(SortInclusionOrderingReward(), SortDistanceReward(weight=0.0))
    pool = candidates()
    flt = DifficultyFilter(n=N, mode=mode, low=low, high=high, batch_size=32, **pass_options)
    stats = flt.refresh(module, pool, epoch=0, seed=0, min_kept=1)
    want = expected_kept(pool, mode, low, high)
    assert [example["prompt"] for example in flt.kept] == want and 0 < len(want) < len(pool)
    assert flt.pass_counts == [scripted_passes(c["prompt"]) for c in pool]
    counts = [sum(scripted_passes(c["prompt"]) == k for c in pool) for k in range(N + 1)]
    assert [stats[f"curriculum/passes_{k}_of_{N}"] for k in range(N + 1)] == counts
    assert stats["curriculum/kept"] == len(want) and stats["curriculum/candidates"] == len(pool)
    assert stats["curriculum/kept_fraction"] == pytest.approx(len(want) / len(pool))
    assert stats["curriculum/completions"] == len(pool) * N and stats["curriculum/estimation_s"] > 0
    if mode == "fail_all":
        assert stats["curriculum/too_easy"] == len(pool) - counts[0] and stats["curriculum/too_hard"] == 0
    else:
        rates = [k / N for k in range(N + 1)]
        assert stats["curriculum/too_hard"] == sum(c for c, r in zip(counts, rates, strict=True) if r <= low)
        assert stats["curriculum/too_easy"] == sum(c for c, r in zip(counts, rates, strict=True) if r >= high)


def test_pass_criteria_are_checked():
    module = module_with_rewards(SortInclusionOrderingReward())
    with pytest.raises(ValueError, match="not one of the run's rewards"):
        DifficultyFilter(pass_reward="nope", pass_reward_max=1).refresh(module, candidates(4), epoch=0, seed=0)
    with pytest.raises(ValueError, match="set difficulty_filter.pass_reward_max"):
        DifficultyFilter(pass_reward="sort_inclusion_ordering").refresh(module, candidates(4), epoch=0, seed=0)
    for bad, match in [
        ({"mode": "easy"}, "mode='easy' is not valid"),
        ({"low": 0.5, "high": 0.5}, "low < high"),
        ({"pass_threshold": 1.0, "pass_reward": "x"}, "not both"),
        ({"too_few": "panic"}, "too_few='panic'"),
    ]:
        with pytest.raises(ValueError, match=match):
            DifficultyFilter(**bad)


def test_too_few_survivors_fall_back_or_fail():
    module = module_with_rewards(SortInclusionOrderingReward())
    pool = candidates(40)
    flt = DifficultyFilter(n=N, low=0.9, high=1.0)  # nothing has 0.9 < pass rate < 1 with n = 4
    stats = flt.refresh(module, pool, epoch=0, seed=0, min_kept=8)
    assert flt.kept is None and stats["curriculum/fallback"] == 1 and stats["curriculum/kept"] == 0
    with pytest.raises(RuntimeError, match="kept 0 of 40 prompts, fewer than one batch"):
        DifficultyFilter(n=N, low=0.9, too_few="error").refresh(module, pool, epoch=0, seed=0, min_kept=8)


class Recorder(pl.Callback):
    def __init__(self):
        self.prompts = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.prompts.append([tuple(p) for p in batch["prompt"]])


def fit_with_filter(tmp_path, flt, epochs=2, steps=3, batch_size=8, policy_class=ScriptedSortPolicy):
    pl.seed_everything(0)
    module = RLVRModule(policy_class(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=N)
    data = RLVRDataModule(SortTask(vocab_size=V, length=L, num_val=0), batch_size=batch_size, difficulty_filter=flt)
    recorder = Recorder()
    trainer = pl.Trainer(
        max_epochs=epochs,
        limit_train_batches=steps,
        logger=pl.loggers.CSVLogger(tmp_path, name="csv"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=[SortInclusionOrderingReward(), recorder],
    )
    trainer.fit(module, data)
    return trainer, data, recorder


def test_training_uses_only_kept_prompts_and_logs_the_curriculum(tmp_path):
    flt = DifficultyFilter(n=N, max_candidates=64, batch_size=16)
    trainer, data, recorder = fit_with_filter(tmp_path, flt)
    assert trainer.reload_dataloaders_every_n_epochs == 1 and flt.refresh_index == 2  # before training, after epoch 0
    # the second refresh scored the next 64 prompts of the stream, and epoch 1 trained on its survivors only
    stream = SortStream(SortTask(vocab_size=V, length=L))
    second = [stream.example_at(i) for i in range(64, 128)]
    kept = {tuple(p) for p in expected_kept(second, "window")}
    assert [e["prompt"] for e in flt.kept] == [list(p) for p in expected_kept(second, "window")]
    assert all(set(batch) <= kept for batch in recorder.prompts[3:]) and len(recorder.prompts) == 6
    rows = list(csv.DictReader(open(next(Path(tmp_path).rglob("metrics.csv")))))
    logged = [r for r in rows if r.get("curriculum/kept")]
    assert [int(r["step"]) for r in logged] == [0, 3]
    for key in [
        "curriculum/kept_fraction",
        "curriculum/too_easy",
        "curriculum/too_hard",
        "curriculum/estimation_s",
        "curriculum/completions",
        f"curriculum/passes_0_of_{N}",
        f"curriculum/passes_{N}_of_{N}",
    ]:
        assert logged[-1][key] != "", key
    assert float(logged[-1]["curriculum/completions"]) == 64 * N


def test_fallback_trains_on_the_unfiltered_stream(tmp_path):
    flt = DifficultyFilter(n=N, max_candidates=32, low=0.9)  # nothing survives
    with pytest.warns(UserWarning, match="fewer than one batch: training on the unfiltered pool"):
        _, data, recorder = fit_with_filter(tmp_path, flt, epochs=1, steps=2)
    stream = SortStream(SortTask(vocab_size=V, length=L))
    # the candidates took prompts 0..31; training read on from 32
    assert recorder.prompts[0] == [tuple(stream.example_at(i)["prompt"]) for i in range(32, 40)]
    assert data.source_position == 32 + 2 * 8


def test_filter_needs_a_step_limit_per_epoch(tmp_path):
    pl.seed_everything(0)
    module = RLVRModule(ScriptedSortPolicy(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=N)
    data = RLVRDataModule(
        SortTask(vocab_size=V, length=L, num_val=0), batch_size=4, difficulty_filter=DifficultyFilter()
    )
    trainer = pl.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[SortInclusionOrderingReward()],
    )
    with pytest.raises(ValueError, match="set trainer.limit_train_batches"):
        trainer.fit(module, data)


# ---------------------------------------------------------------- positions of the training stream


def read(loader, batches: int) -> list[list[list[int]]]:
    return [batch["prompt"] for batch in itertools.islice(iter(loader), batches)]


def test_stream_does_not_depend_on_worker_processes():
    task = SortTask(vocab_size=V, length=L, num_val=0)
    single = read(RLVRDataModule(task, batch_size=4).train_dataloader(), 6)
    workers = read(RLVRDataModule(task, batch_size=4, num_workers=2).train_dataloader(), 6)
    stream = SortStream(task)
    assert single == workers == [[stream.example_at(4 * b + i)["prompt"] for i in range(4)] for b in range(6)]


def test_ranks_read_disjoint_interleaved_shares():
    source = example_source(SortStream(SortTask(vocab_size=V, length=L)), seed=0)
    shares = [list(itertools.islice(iter(PromptStream(source, 2, rank, 2, start=10)), 2)) for rank in (0, 1)]
    assert [batch["prompt"] for batch in shares[0]] == [
        [source[i]["prompt"] for i in pair] for pair in ((10, 11), (14, 15))
    ]
    assert [batch["prompt"] for batch in shares[1]] == [
        [source[i]["prompt"] for i in pair] for pair in ((12, 13), (16, 17))
    ]


def test_finite_pools_are_reshuffled_every_pass_and_resume_mid_pass():
    task = SortTask(vocab_size=V, length=L, num_train=12, num_val=0)
    data = RLVRDataModule(task, batch_size=4, seed=1)
    loader = data.train_dataloader()
    assert len(loader) == 3
    pool = sorted(e["prompt"] for e in task.train_dataset())
    first, second = read(loader, 3), None
    data.source_position = 12  # as if the first pass had been trained on
    second = read(loader, 3)
    assert sorted(p for batch in first for p in batch) == pool == sorted(p for batch in second for p in batch)
    assert first != second
    resumed = RLVRDataModule(task, batch_size=4, seed=1)
    resumed.load_state_dict({**data.state_dict(), "source_position": 16})  # one batch into the second pass
    assert read(resumed.train_dataloader(), 2) == second[1:]


def test_topup_batches_come_from_elsewhere_and_resume():
    task = SortTask(vocab_size=V, length=L, num_val=0)
    data = RLVRDataModule(task, batch_size=4)
    stream = SortStream(task)
    first = data.topup_batch()
    assert first["prompt"] == [stream.example_at(2**40 + i)["prompt"] for i in range(4)]
    state = data.state_dict()
    second = data.topup_batch()
    resumed = RLVRDataModule(task, batch_size=4)
    resumed.load_state_dict(state)
    assert resumed.topup_batch() == second and state["topup_batches"] == [1]
    pool = RLVRDataModule(SortTask(vocab_size=V, length=L, num_train=12, num_val=0), batch_size=4)
    topups = [p for _ in range(3) for p in pool.topup_batch()["prompt"]]
    assert sorted(topups) == sorted(e["prompt"] for e in pool.task.train_dataset())  # another shuffle of the pool


class RecordingWandbLogger(pl.loggers.WandbLogger):
    """A WandbLogger that records what it is given instead of starting a W&B run."""

    def __init__(self):
        super().__init__(offline=True)
        self.logged = []

    @property
    def experiment(self):
        return None

    def log_metrics(self, metrics, step=None):
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_pass_rate_histogram_goes_to_wandb(tmp_path):
    import wandb

    pl.seed_everything(0)
    logger = RecordingWandbLogger()
    module = RLVRModule(ScriptedSortPolicy(vocab_size=V, prompt_length=L, embedding_dim=4), group_size=N)
    flt = DifficultyFilter(n=N, max_candidates=64)
    data = RLVRDataModule(SortTask(vocab_size=V, length=L, num_val=0), batch_size=8, difficulty_filter=flt)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SortInclusionOrderingReward()],
    )
    trainer.fit(module, data)
    histograms = [
        m["curriculum/pass_rate_histogram"] for _, m in logger.logged if "curriculum/pass_rate_histogram" in m
    ]
    assert len(histograms) == 1 and isinstance(histograms[0], wandb.Histogram)
    expected = [sum(scripted_passes(c["prompt"]) == k for c in flt.candidates) for k in range(N + 1)]
    assert list(histograms[0].histogram) == expected and len(histograms[0].bins) == N + 2


class Counting(torch.utils.data.IterableDataset):
    """A stream without `example_at`: read in order."""

    def __iter__(self):
        return ({"prompt": [i % V, (i // V) % V, 0], "i": i} for i in itertools.count())


class CountingTask(SortTask):
    def train_dataset(self):
        return Counting()


def test_streams_without_random_access_resume_by_skipping():
    data = RLVRDataModule(CountingTask(num_val=0), batch_size=3)
    data.load_state_dict({**data.state_dict(), "source_position": 7})
    batches = [batch["metadata"] for batch in itertools.islice(iter(data.train_dataloader()), 2)]
    assert [m["i"] for batch in batches for m in batch] == list(range(7, 13))
    with pytest.raises(ValueError, match="cannot be read exactly by worker processes"):
        next(iter(RLVRDataModule(CountingTask(num_val=0), batch_size=3, num_workers=2).train_dataloader()))
