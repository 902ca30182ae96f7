"""`RolloutTableLogger`: a sample of training rollouts (prompt, completion, each reward, advantage) every n steps.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.callbacks.rollout_table.RolloutTableLogger
          init_args: {every_n_steps: 10, num_rows: 8}

With a `WandbLogger` among the trainer's loggers the sample is logged as a W&B table (key
``rollouts``, at the step of the training metrics); otherwise a few rows are printed to the
console as a rich table. Whole groups are shown (the responses to one prompt side by side is what
makes group-relative advantages readable), from groups drawn at random with a seed of the step.

The callback reads the step's trained rollout from ``pl_module.last_rollout`` when the module keeps
one (`RLVRModule` does: under dynamic sampling that is the batch that was trained, not the last
top-up round), else it wraps the module's ``score`` method (which every rollout passes through
before its advantages are computed) to keep a reference to the latest training rollout.
"""

from __future__ import annotations

import random
from typing import Annotated, Any

import lightning.pytorch as pl
from lightning.pytorch import Callback

from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE_INT


def _shorten(text: str | None, max_chars: int) -> str:
    if text is None:
        return ""
    if len(text) <= max_chars:
        return text
    half = max(1, (max_chars - 5) // 2)
    return text[:half] + " ... " + text[-half:]


def rollout_rows(rollout: Rollout, rows: list[int], max_chars: int = 1000) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of a table of `rows` of `rollout`: group, prompt, completion, rewards, advantage, length, and
    whether the completion is a demonstration from the data (a column only where the rollout has any)."""
    names = list(rollout.rewards)
    shown = rollout.demonstration_rows
    columns = ["group", "prompt", "completion", "reward", *names, "advantage", "length"]
    columns += [] if shown is None else ["demonstration"]
    advantages = rollout.advantages
    if advantages is not None and advantages.dim() == 2:  # token-level: the mean over the response
        mask = rollout.response_mask.float()
        advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    lengths = rollout.response_lengths()
    data = []
    for i in rows:
        prompt = rollout.prompt_text[i] if rollout.prompt_text else str(rollout.prompt_ids[i].tolist())
        completion = rollout.response_text[i] if rollout.response_text else str(rollout.response_ids[i].tolist())
        data.append(
            [
                int(rollout.group_index[i]),
                _shorten(prompt, max_chars),
                _shorten(completion, max_chars),
                float(rollout.reward[i]) if rollout.reward is not None else float("nan"),
                *[float(rollout.rewards[name][i]) for name in names],
                float(advantages[i]) if advantages is not None else float("nan"),
                int(lengths[i]),
                *([] if shown is None else [bool(shown[i])]),
            ]
        )
    return columns, data


@documented_options
class RolloutTableLogger(Callback):
    """Logs `num_rows` rows of the training rollout every `every_n_steps` rollout steps (W&B table or console)."""

    def __init__(
        self,
        every_n_steps: Annotated[
            int, Option("log on rollout steps n, 2n, ... (and the first step).", POSITIVE_INT)
        ] = 10,
        num_rows: Annotated[int, Option("rows per W&B table.", POSITIVE_INT)] = 8,
        max_chars: Annotated[
            int, Option("prompts and completions longer than this are shortened in the middle.", POSITIVE_INT)
        ] = 1000,
        console: bool | None = None,
        console_rows: Annotated[int, Option("rows printed to the console.", NON_NEGATIVE_INT)] = 4,
        key: str = "rollouts",
    ) -> None:
        """
        Args:
            console: print to the console; None prints only when no W&B logger is attached.
            key: W&B table key.
        """
        check_options(RolloutTableLogger, locals())
        self.every_n_steps = every_n_steps
        self.num_rows = num_rows
        self.max_chars = max_chars
        self.console = console
        self.console_rows = console_rows
        self.key = key
        self._captured: Rollout | None = None
        self._wrapped: Any = None

    # ------------------------------------------------------------------ capture

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        score = getattr(pl_module, "score", None)
        if score is None or self._wrapped is pl_module or hasattr(pl_module, "last_rollout"):
            return

        def capturing_score(rollout: Rollout, *args, **kwargs):
            result = score(rollout, *args, **kwargs)
            if pl_module.training:
                self._captured = rollout  # advantages are filled in later on this same object
            return result

        pl_module.score = capturing_score
        self._wrapped = pl_module

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._wrapped is pl_module and "score" in vars(pl_module):
            del pl_module.score  # back to the class's method
        self._wrapped = None
        self._captured = None

    def _rollout(self, pl_module: pl.LightningModule) -> Rollout | None:
        rollout = getattr(pl_module, "last_rollout", None)
        return rollout if isinstance(rollout, Rollout) else self._captured

    # ------------------------------------------------------------------ logging

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.fit_loop.epoch_loop.batch_progress.total.ready  # rollout steps started, this one included
        if not trainer.is_global_zero or not (step == 1 or step % self.every_n_steps == 0):
            return
        rollout = self._rollout(pl_module)
        if rollout is None:
            return
        self._captured = None
        wandb_loggers = [lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"]
        columns, data = rollout_rows(rollout, self.sample_rows(rollout, step), self.max_chars)
        log_step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in wandb_loggers:
            logger.log_table(
                key=self.key, columns=["step", *columns], data=[[step, *row] for row in data], step=log_step
            )
        if self.console or (self.console is None and not wandb_loggers):
            self.print_table(columns, data[: self.console_rows], step)

    def sample_rows(self, rollout: Rollout, step: int) -> list[int]:
        """Up to `num_rows` rows: whole groups, drawn at random (seeded by the step)."""
        groups = rollout.group_index.tolist()
        order = list(dict.fromkeys(groups))
        random.Random(step).shuffle(order)
        rank = {g: r for r, g in enumerate(order)}
        rows = sorted(range(rollout.num_rows), key=lambda i: (rank[groups[i]], i))
        return rows[: self.num_rows]

    @staticmethod
    def print_table(columns: list[str], data: list[list[Any]], step: int, width: int = 160) -> None:
        """A rich table on stdout; prompts are cut to their last 100 characters (the end is what differs)."""
        from rich.console import Console
        from rich.table import Table

        console = Console(width=width)
        console.print(f"[bold]rollouts at step {step}[/bold]")
        table = Table(show_lines=True)
        for column in columns:
            table.add_column(column, overflow="fold")
        prompt_column = columns.index("prompt") if "prompt" in columns else -1
        for row in data:
            cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in row]
            if prompt_column >= 0 and len(cells[prompt_column]) > 100:
                cells[prompt_column] = "..." + cells[prompt_column][-100:]
            table.add_row(*cells)
        console.print(table)


__all__ = ["RolloutTableLogger", "rollout_rows"]
