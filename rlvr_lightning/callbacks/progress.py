"""What the console shows while a run trains.

- `RewardProgressBar`: Lightning's Rich progress bar with the mean reward, and a column saying what
  the current step is doing ("generate 17/32 tokens", "score", "update") so that a step of minutes
  does not look hung. It drops Lightning's `v_num` (the logger's run id, meaningless here) and
  routes Lightning's log lines ("`Trainer.fit` stopped: ...") above the bar instead of into it.
- `ProgressLines`: for runs without a bar (logs, batch jobs): a console line every `every_s`
  seconds while a step runs, saying what it is doing.

Both listen to `rlvr_lightning.runtime.stage_reports` (stages reported by the module, tokens by the generation loop).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Annotated

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, RichProgressBar
from lightning.pytorch.utilities import rank_zero_only
from rich.progress import ProgressColumn
from rich.text import Text

from rlvr_lightning.runtime import stage_reports
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE

METRICS_MAX_AGE_S = 1.0  # slow steps update the metrics column after every batch
LOG_NAMES = ("lightning", "lightning.pytorch", "lightning.fabric", "")  # loggers Lightning prints through


class StepStatus:
    """The stage and token count of the step in progress, as reported through `rlvr_lightning.runtime.stage_reports`."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.stage: str | None = None
        self.tokens: tuple[int, int] | None = None
        self.step_started: float | None = None

    def on_stage(self, stage: str) -> None:
        if self.step_started is None:
            self.step_started = time.monotonic()
        self.stage, self.tokens = stage, None

    def on_tokens(self, done: int, total: int) -> None:
        if self.step_started is None:
            self.step_started = time.monotonic()
        self.tokens = (done, total)

    def text(self) -> str:
        if self.stage is None and self.tokens is None:
            return ""
        parts = [self.stage or "generate"]
        if self.tokens is not None:
            parts.append(f"{self.tokens[0]}/{self.tokens[1]} tokens")
        return " ".join(parts)


class StageColumn(ProgressColumn):
    """The step status, on the row of the task in progress (training or validation)."""

    def __init__(self, bar: RewardProgressBar) -> None:
        super().__init__()
        self.bar = bar

    def render(self, task) -> Text:
        return Text(self.bar.status.text() if task.id == self.bar.active_task_id() else "", style="cyan")


class RewardProgressBar(RichProgressBar):
    """Rich progress bar that shows what the current step is doing and recomputes its metrics column
    (mean reward, ...) every `refresh_rate` training batches instead of every batch (on a small task that
    bookkeeping is a few percent of a step), or after every batch when steps take over a second."""

    def __init__(self, refresh_rate: int = 10, **kwargs) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.status = StepStatus()
        self._last_token_refresh = 0.0
        self._metrics_updated = 0.0
        self._rerouted: list[tuple[logging.StreamHandler, object]] = []

    # ------------------------------------------------------------ step status

    def active_task_id(self):
        trainer = self._trainer
        if trainer is not None and (trainer.validating or trainer.sanity_checking):
            return self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
        return self.train_progress_bar_id

    def on_stage(self, stage: str) -> None:
        self.status.on_stage(stage)
        self.refresh()

    def on_tokens(self, done: int, total: int) -> None:
        self.status.on_tokens(done, total)
        now = time.monotonic()
        if now - self._last_token_refresh >= 0.2 or done == total:
            self._last_token_refresh = now
            self.refresh()

    def configure_columns(self, trainer: pl.Trainer) -> list:
        return [*super().configure_columns(trainer), StageColumn(self)]

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.is_enabled and trainer.is_global_zero:
            stage_reports.add_listener(self)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.status.clear()
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.status.clear()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.status.clear()
        super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        stage_reports.remove_listener(self)
        super().teardown(trainer, pl_module, stage)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        stage_reports.remove_listener(self)
        super().on_exception(trainer, pl_module, exception)

    # ------------------------------------------------------------ metrics

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def _update_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every `refresh_rate` batches, or after any batch when the last update is a second old (slow steps)."""
        now = time.monotonic()
        batch = trainer.fit_loop.epoch_loop.batch_progress.current.completed + 1
        if trainer.training and batch % self.refresh_rate and now - self._metrics_updated < METRICS_MAX_AGE_S:
            return
        self._metrics_updated = now
        super()._update_metrics(trainer, pl_module)

    # ------------------------------------------------------------ log lines above the bar

    def _init_progress(self, trainer: pl.Trainer) -> None:
        super()._init_progress(trainer)
        if self.progress is not None and not self._rerouted:
            self._reroute_log_handlers()

    def _stop_progress(self) -> None:
        super()._stop_progress()
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted = []

    def _reroute_log_handlers(self) -> None:
        """While Rich draws the bar it replaces sys.stderr with a proxy that prints above the bar; Lightning's log
        handlers hold the real stream, so their lines ("`Trainer.fit` stopped") land inside the bar and the bar
        is drawn again below them. Point them at the proxy while the bar is live."""
        if sys.stderr is sys.__stderr__:  # no live display (not a terminal): nothing to do
            return
        for name in LOG_NAMES:
            for handler in logging.getLogger(name).handlers:
                if type(handler) is logging.StreamHandler and handler.stream in (sys.__stderr__, sys.__stdout__):
                    self._rerouted.append((handler, handler.stream))
                    handler.setStream(sys.stderr)


@documented_options
class ProgressLines(Callback):
    """Prints what a long step is doing every `every_s` seconds (for runs without a progress bar)."""

    def __init__(
        self,
        every_s: Annotated[float, Option("seconds between lines (0: a line at every report).", NON_NEGATIVE)] = 60.0,
    ) -> None:
        check_options(ProgressLines, locals())
        self.every_s = every_s
        self.status = StepStatus()
        self._next_line = 0.0
        self._step = ""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            stage_reports.add_listener(self)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        stage_reports.remove_listener(self)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        stage_reports.remove_listener(self)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module, batch, batch_idx: int) -> None:
        total = trainer.num_training_batches
        self._step = f"rollout step {trainer.fit_loop.epoch_loop._batches_that_stepped + 1}" + (
            f" (epoch {trainer.current_epoch}, batch {batch_idx + 1}/{total})" if isinstance(total, int) else ""
        )
        self._start_step()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._step = f"validation batch {batch_idx + 1}"
        self._start_step()

    def _start_step(self) -> None:
        self.status.clear()
        self.status.step_started = time.monotonic()
        self._next_line = self.status.step_started + self.every_s

    def on_stage(self, stage: str) -> None:
        self.status.on_stage(stage)
        self._maybe_print()

    def on_tokens(self, done: int, total: int) -> None:
        self.status.on_tokens(done, total)
        self._maybe_print()

    @rank_zero_only
    def _maybe_print(self) -> None:
        now = time.monotonic()
        if now < self._next_line:
            return
        self._next_line = now + self.every_s
        elapsed = now - self.status.step_started if self.status.step_started is not None else 0.0
        print(f"rlvr: {self._step}, {elapsed:.0f} s in: {self.status.text()}", flush=True)
