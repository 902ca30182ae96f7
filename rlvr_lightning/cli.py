"""The `rlvr` command: a `LightningCLI` over `RLVRModule` and `RLVRDataModule`.

    rlvr fit --config configs/sort_grpo.yaml
    rlvr fit --config configs/sort_grpo.yaml --print_config

The module and data module are chosen with `class_path` (`RLVRModule`, `SFTModule`,
`ExpertIterationModule`; `RLVRDataModule`, `SFTDataModule`, ...).
Default logging: Weights & Biases in offline mode (no account or network needed; sync later
with `wandb sync`) plus a CSV log, under `trainer.default_root_dir`.
"""

from __future__ import annotations

import os
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import LightningCLI


TRAINER_DEFAULTS = {
    "accelerator": "auto",
    "devices": 1,
    "default_root_dir": "runs",
    "logger": [
        {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"offline": True, "project": "rlvr_lightning", "save_dir": "runs"}},
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs", "name": "csv"}},
    ],
    "log_every_n_steps": 1,
}


class RewardProgressBar(RichProgressBar):
    """Rich progress bar that recomputes its metrics column (mean reward, ...) every `refresh_rate`
    training batches instead of every batch: on a small task that bookkeeping is a few percent of a step."""

    def __init__(self, refresh_rate: int = 10, **kwargs) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)

    def _update_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.training and (trainer.fit_loop.epoch_loop.batch_progress.current.completed + 1) % self.refresh_rate:
            return
        super()._update_metrics(trainer, pl_module)


class RLVRCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--torch_threads",
            type=int | None,
            default=None,
            help="torch intra-op threads (torch.set_num_threads); null keeps torch's default. Tiny models "
            "run fastest on 1, and on a machine shared with other jobs more threads than free cores can be "
            "many times slower.",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        threads = config.get("torch_threads")
        if threads:
            torch.set_num_threads(threads)

    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        """Adds a Rich progress bar (showing the mean reward) unless the config has a progress bar or disables it."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = list(trainer_config.get("callbacks") or [])
        has_bar = any(isinstance(cb, pl.callbacks.ProgressBar) for cb in callbacks)
        if trainer_config.get("enable_progress_bar") is not False and not has_bar:
            kwargs["callbacks"] = [*callbacks, RewardProgressBar()]
        return super().instantiate_trainer(**kwargs)

    def _parse_ckpt_path(self) -> None:
        """The config rebuilds the run, not the checkpoint's hyper-parameters (they exclude the policy).

        LightningCLI would re-parse those hyper-parameters as the model config, which fails for
        `--ckpt_path path/to/file.ckpt`; the checkpoint is read by the trainer's checkpoint IO instead,
        which names the file and the reason when it cannot be read."""


def main(args: list[str] | None = None, run: bool = True) -> RLVRCLI:
    """`rlvr ...`; with `run=False` the config is parsed and instantiated but nothing runs (no subcommand)."""
    argv = sys.argv[1:] if args is None else args
    if argv and argv[0] == "export":  # a checkpoint as a Hugging Face directory: rlvr_lightning/export.py
        from rlvr_lightning import export

        return export.main(argv[1:])
    os.environ.setdefault("WANDB_SILENT", "true")
    return RLVRCLI(
        pl.LightningModule,  # RLVRModule, SFTModule, ExpertIterationModule, ... chosen by class_path
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


def entry_point() -> None:
    """The `rlvr` console script (exit status 0 on success; `main` returns the CLI object)."""
    main()


if __name__ == "__main__":
    entry_point()
