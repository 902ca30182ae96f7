"""`rlvr eval`: `rlvr validate` with its decoding chosen on the command line, and a JSON report.

    rlvr eval --config configs/smollm2_arithmetic.yaml --ckpt_path runs/x/checkpoints/last.ckpt
    rlvr eval --config configs/smollm2_arithmetic.yaml --eval.samples 8 --eval.temperature 0.7 --eval.output eval.json

Without `--ckpt_path` the config's own weights are evaluated (for most configs, the untrained model). The
held-out prompts, the rewards that score them and the trainer options (`limit_val_batches`, precision, devices)
are the config's, so with the config's decoding it reproduces the `val/` metrics a run logged for a checkpoint.

LightningCLI runs a subcommand as a method of the Trainer, so `EvalTrainer` is Lightning's Trainer with an
`eval` method (`evaluate`); `rlvr` builds every trainer as one (nothing else differs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from rlvr_lightning.callbacks.run_checkpoints import earlier_checkpoints
from rlvr_lightning.evaluation.report import EvalOptions, EvalRecorder, eval_report
from rlvr_lightning.modules.options import ValidationConfig
from rlvr_lightning.modules.policy_module import PolicyModule
from rlvr_lightning.runtime.checkpoint_files import CheckpointNotFoundError


class EvalTrainer(pl.Trainer):
    def evaluate(
        self,
        model: pl.LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: pl.LightningDataModule | None = None,
        eval: EvalOptions = EvalOptions(),  # `--eval.samples`: the group is named as the command
    ) -> dict[str, Any]:
        """Evaluate a checkpoint (--ckpt_path; without it, the config's weights) on the held-out prompts, greedy or
        sampled (--eval.*), and report accuracy, pass@k and maj@k as JSON.

        Args:
            ckpt_path: a `.ckpt` file, `last` (the run's last checkpoint) or null (the config's weights).
            verbose: print the validation metrics as a table.
            eval: how the held-out prompts are answered (null: as the config's validation does).
        """
        if not isinstance(model, PolicyModule):
            raise ValueError(f"rlvr eval evaluates a policy module (RLVRModule, SFTModule, ...), not {type(model)}")
        if str(ckpt_path) == "last" and not earlier_checkpoints(self.checkpoint_callbacks):
            # Lightning would warn and evaluate the config's weights
            directories = ", ".join(sorted({str(cb.dirpath) for cb in self.checkpoint_callbacks if cb.dirpath}))
            raise CheckpointNotFoundError(
                f"--ckpt_path last: {directories or 'the run'} holds no last.ckpt; name the run (--run_name) or "
                "the file, or leave --ckpt_path out to evaluate the config's weights"
            )
        samples, greedy = eval.decoding(model.validation.group_size, model.validation.greedy)
        model.validation = ValidationConfig(group_size=samples, greedy=greedy)
        if eval.temperature is not None:
            model.sampling = dataclasses.replace(model.sampling, temperature=eval.temperature)
        recorder = EvalRecorder(samples)
        self.callbacks.append(recorder)
        try:
            self.validate(model, dataloaders, ckpt_path, verbose, datamodule)
        finally:
            self.callbacks.remove(recorder)
        return eval_report(self.callback_metrics, recorder, greedy, model.sampling.temperature, self.ckpt_path)

    # the subcommand; the method keeps another name since jsonargparse names the group of a method's arguments
    # after the method, and `eval` is the group of its options
    eval = evaluate
