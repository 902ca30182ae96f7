"""What `rlvr eval` reports: how it decodes (`EvalOptions`), what its validation pass saw (`EvalRecorder`), and the
report (`eval_report`): the validation metrics under short names, with the number of prompts and responses.

    {"accuracy": 0.62, "pass@4": 0.81, "maj@4": 0.7, "format_rate": 0.97, "response_length": 21.3,
     "reward_mean": 0.66, "prompts": 100, "responses": 400, "samples": 4, "greedy": false, "temperature": 1.0,
     "checkpoint": "runs/x/checkpoints/last.ckpt", "date": "2026-12-01T10:00:00+00:00", "generation": {...}}

`accuracy` is the share of correct responses (with one response per prompt: of prompts), `pass@k` the unbiased
pass@k estimate and `maj@k` the majority-vote accuracy, with k = `samples` (`evaluation/metrics.py`).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import lightning.pytorch as pl
import torch

from rlvr_lightning.runtime.distributed import reduce_across_ranks
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range


@documented_options
@dataclass(frozen=True)
class EvalOptions:
    """How `rlvr eval` answers the held-out prompts; null: as the config's validation does."""

    samples: Annotated[
        int | None,
        Option(
            "responses per prompt; pass@k and maj@k are reported with k = samples (null: validation.group_size).",
            Range(1, integer=True, optional=True),
        ),
    ] = None
    greedy: Annotated[
        bool | None,
        Option("decode greedily, one response per prompt (null: validation.greedy, sampled when samples > 1)."),
    ] = None
    temperature: Annotated[
        float | None,
        Option(
            "the temperature of sampled decoding (null: the config's sampling.temperature).",
            Range(0, low_open=True, optional=True),
        ),
    ] = None
    output: Annotated[str | None, Option("also write the report (JSON) to this file (null: print it only).")] = None

    def __post_init__(self) -> None:
        check_options(EvalOptions, vars(self), "eval.")

    def decoding(self, group_size: int, greedy: bool) -> tuple[int, bool]:
        """(samples, greedy) given the config's `validation.group_size` and `validation.greedy`; a ValueError
        that starts with the option it is about when they contradict each other."""
        samples = self.samples if self.samples is not None else group_size
        if self.greedy is not None:
            greedy = self.greedy
        elif self.samples is not None and self.samples > 1:
            greedy = False
        if greedy and samples > 1:
            where = f"eval.samples={samples}" if self.samples is not None else f"validation.group_size={samples}"
            raise ValueError(
                f"eval.greedy=True gives one response per prompt, not {where}; choose --eval.greedy false "
                "(sampled) or --eval.samples 1"
            )
        if greedy and self.temperature is not None:
            raise ValueError(
                f"eval.temperature={self.temperature} is the temperature of sampled decoding, and the evaluation is "
                "greedy; add --eval.greedy false or leave eval.temperature out"
            )
        return samples, greedy


class EvalRecorder(pl.Callback):
    """Counts the prompts and responses of a validation pass and averages the policy's generation statistics
    (`last_generation_stats`) over its batches, weighted by their responses (on several processes, the counts
    are summed over ranks and the statistics are the first rank's)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.prompts = 0
        self._stat_sums: dict[str, float] = {}
        self._stat_rows = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        prompts = len(batch["prompt"])
        self.prompts += prompts
        stats = getattr(getattr(pl_module, "policy", None), "last_generation_stats", None) or {}
        rows = prompts * self.samples
        for key, value in stats.items():
            self._stat_sums[key] = self._stat_sums.get(key, 0.0) + float(value) * rows
        self._stat_rows += rows

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        counts = torch.tensor([float(self.prompts)], device=pl_module.device)
        self.prompts = int(reduce_across_ranks(trainer, counts, ["prompts"], {"prompts": "sum"})[0])

    def generation(self) -> dict[str, float]:
        return {key: total / self._stat_rows for key, total in sorted(self._stat_sums.items()) if self._stat_rows}


def eval_report(
    metrics: Mapping[str, Any],
    recorder: EvalRecorder,
    greedy: bool,
    temperature: float | None,
    checkpoint: str | None,
) -> dict[str, Any]:
    """The report of a validation pass: its `val/` metrics without the prefix (`majority_vote_accuracy` as
    `maj@k`), the counts, how it decoded (`temperature`: None when greedy), the checkpoint and the date."""
    samples = recorder.samples
    report: dict[str, Any] = {}
    for name, value in sorted(metrics.items()):
        if name.startswith("val/"):
            short = name.removeprefix("val/")
            report[f"maj@{samples}" if short == "majority_vote_accuracy" else short] = float(value)
    report.update(
        prompts=recorder.prompts,
        responses=recorder.prompts * samples,
        samples=samples,
        greedy=greedy,
        temperature=None if greedy else temperature,
        checkpoint=None if checkpoint is None else str(checkpoint),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        generation=recorder.generation(),
    )
    return report


__all__ = ["EvalOptions", "EvalRecorder", "eval_report"]
