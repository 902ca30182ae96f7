"""What a curriculum refresh reports: its stats to the loggers, a line to the console, a pass-rate histogram to W&B.

`RLVRDataModule` calls `publish_refresh` on every rank after `DifficultyFilter.refresh`.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from rlvr_lightning.data.difficulty_filter import DifficultyFilter
from rlvr_lightning.runtime.distributed import log_to_loggers, reduce_across_ranks


def publish_refresh(trainer: pl.Trainer, flt: DifficultyFilter, stats: dict[str, float]) -> None:
    """Reduce the refresh's stats across ranks, keep them in `flt.last_stats`, log and announce them."""
    names = list(stats)
    values = torch.tensor([stats[k] for k in names], dtype=torch.float64, device=trainer.lightning_module.device)
    # the stats are identical on every rank but the estimation time: report the slowest rank
    values = reduce_across_ranks(trainer, values, names, {"curriculum/estimation_s": "max"}).cpu()
    stats = dict(zip(names, values.tolist(), strict=True))
    flt.last_stats = stats
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    log_to_loggers(trainer, stats, step)
    if trainer.is_global_zero:
        _log_wandb_histogram(trainer, flt, step)
    kept, candidates = int(stats["curriculum/kept"]), int(stats["curriculum/candidates"])
    message = (
        f"curriculum refresh {flt.refresh_index} (epoch {trainer.current_epoch}): kept {kept}/{candidates} prompts "
        f"({100 * stats['curriculum/kept_fraction']:.1f}%), too easy {int(stats['curriculum/too_easy'])}, "
        f"too hard {int(stats['curriculum/too_hard'])}; estimation {stats['curriculum/estimation_s']:.2f} s, "
        f"{int(stats['curriculum/completions'])} completions"
    )
    levels = [  # a task with difficulty levels (`Task.update_difficulty`) reports them per dataset
        f"{key.split('/')[1]} {value:.0f} (pass rate {stats[key.removesuffix('level') + 'pass_rate']:.2f})"
        for key, value in stats.items()
        if key.endswith("/level") and key.removesuffix("level") + "pass_rate" in stats
    ]
    if levels:
        message += "; levels after it: " + ", ".join(levels)
    rank_zero_info(message)
    if stats["curriculum/fallback"]:
        rank_zero_warn(
            f"difficulty filter kept {kept} prompts, fewer than one batch: training on the unfiltered pool "
            "until the next refresh"
        )


def _log_wandb_histogram(trainer: pl.Trainer, flt: DifficultyFilter, step: int) -> None:
    from lightning.pytorch.loggers import WandbLogger

    loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
    if not loggers:
        return
    import numpy as np
    import wandb

    n = flt.n
    counts = np.bincount(np.asarray(flt.pass_counts, dtype=np.int64), minlength=n + 1)
    edges = np.linspace(-0.5 / n, 1 + 0.5 / n, n + 2)  # one bin per pass rate k/n
    for logger in loggers:
        logger.log_metrics({"curriculum/pass_rate_histogram": wandb.Histogram(np_histogram=(counts, edges))}, step=step)
