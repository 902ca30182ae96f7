"""The `rlvr` command: a `LightningCLI` over `RLVRModule` and `RLVRDataModule`.

    rlvr fit --config configs/sort_grpo.yaml
    rlvr fit --config configs/sort_grpo.yaml --print_config
    rlvr validate --config configs/sort_grpo.yaml --ckpt_path runs/sort_grpo/checkpoints/last.ckpt
    rlvr eval --config configs/sort_grpo.yaml --ckpt_path last --eval.output eval.json   # the same, as JSON
    rlvr predict --config configs/sort_grpo.yaml --ckpt_path last      # completions -> JSONL

The module and data module are chosen with `class_path` (`RLVRModule`, `SFTModule`,
`ExpertIterationModule`; `RLVRDataModule`, `SFTDataModule`, ...).
Default logging: Weights & Biases in offline mode (no account or network needed; sync later
with `wandb sync`) plus a CSV log flushed every step, under `trainer.default_root_dir`.
A configuration mistake prints a few lines (what, where, the valid choices) and exits with
status 2; `--debug` or `RLVR_DEBUG=1` shows the full parser message and the traceback.

Subcommands are `LightningCLI.subcommands()` (methods of the Trainer; `eval` is `EvalTrainer.eval`, in
`cli/evaluate.py`). A command that is not a Trainer method is a function `command(argv) -> int` in
`EXTRA_COMMANDS`, dispatched before LightningCLI parses anything.
"""

from __future__ import annotations

import json
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

import rlvr_lightning.data  # noqa: F401  registers the data modules: `--data.help RLVRDataModule`
import rlvr_lightning.modules  # noqa: F401  registers the modules: `--model.help RLVRModule`
from rlvr_lightning.callbacks import run_checkpoints
from rlvr_lightning.callbacks.checkpointing import ResumeState
from rlvr_lightning.callbacks.environment import WriteEnvironment
from rlvr_lightning.callbacks.interrupt import SaveOnInterrupt, TrainingInterrupted
from rlvr_lightning.callbacks.predictions import CompletionWriter
from rlvr_lightning.callbacks.progress import ProgressLines, RewardProgressBar
from rlvr_lightning.callbacks.run_lock import DIRPATH_TIP, RunDirectoryLocked, RunLock, describe, is_global_rank_zero
from rlvr_lightning.cli import errors as cli_errors
from rlvr_lightning.cli.errors.config_files import config_limit_problem
from rlvr_lightning.cli.errors.run_errors import RunProblem, explain_export_error, explain_run_error
from rlvr_lightning.cli.evaluate import EvalTrainer
from rlvr_lightning.cli.nested_null import keep_nested_nulls
from rlvr_lightning.cli.working_directory import add_working_directory
from rlvr_lightning.runtime.checkpoint_files import check_checkpoint_path, is_local
from rlvr_lightning.runtime.config_limits import ConfigTooLarge, bound_jsonargparse_yaml
from rlvr_lightning.runtime.hub import go_offline_if_unreachable
from rlvr_lightning.runtime.option_domains import Range
from rlvr_lightning.runtime.process_memory import apply_malloc_choice
from rlvr_lightning.runtime.quiet_console import quiet_loggers, quiet_third_party

TRAINER_DEFAULTS = {
    "accelerator": "auto",
    "devices": 1,
    "default_root_dir": "runs",
    "logger": [
        {
            "class_path": "lightning.pytorch.loggers.WandbLogger",
            "init_args": {"offline": True, "project": "rlvr_lightning", "save_dir": "runs"},
        },
        # flushed every step: a killed run keeps its metrics (46 us per step for 30 metrics, 21 us every 100)
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": "runs", "name": "csv", "flush_logs_every_n_steps": 1},
        },
    ],
    "log_every_n_steps": 1,
}
TORCH_THREADS_DEFAULT = 1  # see README "Language models": measured with scripts/bench_threads.py
TORCH_THREADS_RANGE = Range(1, integer=True, optional=True)
USAGE = "rlvr {command} [-h] [-c CONFIG] [--print_config[=flags]] [--KEY VALUE ...]"
OPTIONS_HELP = (
    "The module's options, with their help: `rlvr {command} --model.help RLVRModule` (or SFTModule, "
    "ExpertIterationModule); the data module's: `rlvr {command} --data.help RLVRDataModule` (or "
    "SFTDataModule); every option of a config with its value: `rlvr {command} --config X --print_config`. "
    "A configuration mistake prints what is wrong, where and the valid choices, and exits with status 2; "
    "--debug (or RLVR_DEBUG=1) shows the full parser message and the traceback."
)
DESCRIPTIONS = {
    "fit": "Train the module of the config. ",
    "validate": "Evaluate a checkpoint (--ckpt_path) on the held-out prompts with the validation metrics. ",
    "eval": "Evaluate a checkpoint (--ckpt_path; without it, the config's weights) on the held-out prompts, greedy "
    "or sampled (--eval.samples, --eval.greedy, --eval.temperature), and print accuracy, pass@k and maj@k as JSON "
    "(--eval.output: also to a file). ",
    "predict": "Write completions for the held-out prompts to JSONL (--ckpt_path: the weights to use). ",
}
DESCRIPTION = (
    "Reinforcement learning from verifiable rewards: train (fit), evaluate (validate; eval: as JSON) and sample "
    "(predict) "
    "the run a YAML config describes; `rlvr export` writes a checkpoint as a Hugging Face directory. "
    "`rlvr fit --help` says how to list the options of the module and the "
    "data module; --debug (or RLVR_DEBUG=1) shows tracebacks of configuration mistakes."
)
REMOVED_COMMANDS = {
    "test": "rlvr has no `test`: no task has a test split apart from its held-out prompts; "
    "`rlvr validate --config X --ckpt_path CKPT` (or `rlvr eval`, which writes JSON) evaluates a checkpoint on them",
}


# Trainer options that take a count of batches (int) or a fraction of them (float).
COUNT_OR_FRACTION = (
    "limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches", "val_check_interval",
    "overfit_batches",
)  # fmt: skip


def parse_counts_as_counts() -> None:
    """Read `limit_train_batches: 1` as one batch, not as 1.0 (100%) or `500` as 500.0 (an error).

    typing caches unions by equality, and `Union[int, float] == Union[float, int]`: a library imported before
    Lightning that spells `Optional[Union[float, int]]` (huggingface_hub 1.33 does) hands its member order to the
    Trainer's `Optional[Union[int, float]]`, and jsonargparse tries the members in that order."""
    annotations = pl.Trainer.__init__.__annotations__
    for name in COUNT_OR_FRACTION:
        members = typing.get_args(annotations.get(name))
        if int in members and float in members and members.index(float) < members.index(int):
            rest = tuple(member for member in members if member not in (int, float))
            annotations[name] = typing.Union[(int, float, *rest)]  # a flat key: not equal to the cached one


parse_counts_as_counts()
bound_jsonargparse_yaml()  # an alias-heavy or oversized config is refused, not expanded until memory runs out
keep_nested_nulls()  # --model.init_args.GROUP.FIELD=null reaches the class as null (cli/nested_null.py)


def _export(argv: list[str]) -> int:
    """`rlvr export`: a checkpoint (a .ckpt file or a sharded directory) as a Hugging Face directory; a misuse
    (a missing argument or file, a non-empty output directory, a policy that cannot be exported) in a few lines."""
    from rlvr_lightning.cli import export

    debug = cli_errors.debug_requested([])[0]  # entry_point took --debug out of argv and set RLVR_DEBUG
    try:
        export.main(argv, exit_on_error=debug)
    except Exception as error:
        problem = None if debug else explain_run_error(error) or explain_export_error(error)
        if problem is None:
            raise
        print(problem.render(), file=sys.stderr)
        return problem.status
    return 0


def _serve(argv: list[str]) -> int:
    """`rlvr serve`: a rollout server (vLLM's OpenAI server with our worker extension) in place of this process."""
    from rlvr_lightning.serving import serve

    return serve.main(argv)


# Commands that are not Trainer methods: name -> function(argv) -> exit status.
EXTRA_COMMANDS: dict[str, Callable[[list[str]], int]] = {"export": _export, "serve": _serve}


class RLVRCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        self._run_locks: dict[str, RunLock] = {}  # checkpoint directory -> its lock, held while `fit` runs
        try:
            super().__init__(*args, **kwargs)
        finally:
            for lock in self._run_locks.values():
                lock.release()

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        commands = {name: skip for name, skip in LightningCLI.subcommands().items() if name not in REMOVED_COMMANDS}
        return {**commands, "eval": commands["validate"]}

    def parse_arguments(self, parser, args) -> None:
        """Also keeps the command line, which `rlvr eval` reports (None when the arguments are a dict)."""
        self.argv = list(sys.argv[1:]) if args is None else list(args) if isinstance(args, (list, tuple)) else None
        super().parse_arguments(parser, args)

    def eval(self, **kwargs) -> None:
        """`rlvr eval`: `EvalTrainer.eval`'s report with the command that produced it, printed as JSON (and written
        to --eval.output)."""
        report = self.trainer.eval(**kwargs)
        configs = self._get(self.config, "config") or []
        command = None if self.argv is None else ["rlvr", *self.argv]
        report.update(config=[str(path) for path in configs], command=command)
        if not self.trainer.is_global_zero:
            return
        text = json.dumps(report, indent=2)
        print(text)
        output = kwargs["eval"].output
        if output:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            Path(output).write_text(text + "\n")

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        subcommands = getattr(self.parser, "_subcommands_action", None)
        for choice in getattr(subcommands, "_choices_actions", []):  # `rlvr --help`: ours, not the Trainer's docstrings
            choice.help = DESCRIPTIONS.get(choice.dest, choice.help).strip()

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--torch_threads",
            type=int | None,
            default=TORCH_THREADS_DEFAULT,
            help="torch intra-op threads (torch.set_num_threads); null keeps torch's default (one per core). "
            "On a CPU shared with other jobs, more threads than free cores can be many times slower; "
            "on a machine of your own with idle cores (or on a GPU) raise it.",
        )
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="the folder of the run's checkpoints, <trainer.default_root_dir>/<run_name>/checkpoints, where "
            "--ckpt_path last looks (default: the names of the --config files joined by '+')",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        quiet_third_party()
        cli_errors.check_options_early(config.as_dict(), {"torch_threads": TORCH_THREADS_RANGE})  # before any model
        if self.subcommand == "eval":
            cli_errors.check_eval_options(config.as_dict())
        threads = config.get("torch_threads")
        if threads:
            torch.set_num_threads(threads)
        check_checkpoint_path(config.get("ckpt_path"))  # a missing file fails now, not after the model loads
        trainer = (config.as_dict() if hasattr(config, "as_dict") else dict(config)).get("trainer") or {}
        name = run_checkpoints.run_name(config.get("config") or [], config.get("run_name"))
        root = trainer.get("default_root_dir")
        directory = run_checkpoints.checkpoint_directory(root, name) if is_local(root or ".") else str(root)
        enabled = trainer.get("enable_checkpointing") is not False
        self._lock_run_directories(run_checkpoints.configured_directories(trainer.get("callbacks"), directory, enabled))
        go_offline_if_unreachable(config.as_dict() if hasattr(config, "as_dict") else dict(config))

    def instantiate_trainer(self, **kwargs) -> pl.Trainer:
        """Adds what the config does not have: a Rich progress bar showing the mean reward and what a long
        step is doing (or, with the bar disabled, a line per minute of a long step), `SaveOnInterrupt`
        and `WriteEnvironment` (environment.json beside the logs) for `fit`, a JSONL writer of the
        completions for `predict`, `ResumeState`, and a checkpoint callback in the run's directory when there
        is none (`run_checkpoints`)."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = trainer_config.get("callbacks") or []
        callbacks = [callbacks] if isinstance(callbacks, pl.Callback) else list(callbacks)  # Lightning accepts one
        added = []
        if trainer_config.get("enable_progress_bar") is not False:
            if not any(isinstance(cb, pl.callbacks.ProgressBar) for cb in callbacks):
                added.append(RewardProgressBar())
        elif not any(isinstance(cb, ProgressLines) for cb in callbacks):
            added.append(ProgressLines())
        if self.subcommand == "fit" and not any(isinstance(cb, SaveOnInterrupt) for cb in callbacks):
            added.append(SaveOnInterrupt())
        if self.subcommand == "fit" and not any(isinstance(cb, WriteEnvironment) for cb in callbacks):
            added.append(WriteEnvironment())
        if self.subcommand == "predict" and not any(isinstance(cb, BasePredictionWriter) for cb in callbacks):
            root = trainer_config.get("default_root_dir") or "."
            added.append(CompletionWriter(os.path.join(str(root), "predictions.jsonl")))
        # RNG states in checkpoints, atomic files; first, so that its step-start restore precedes any draw
        first = [] if any(isinstance(cb, ResumeState) for cb in callbacks) else [ResumeState()]
        added += self._place_checkpoints(trainer_config, callbacks)
        quiet_loggers(trainer_config.get("logger"))
        if added or first:
            kwargs["callbacks"] = [*first, *callbacks, *added]
        return super().instantiate_trainer(**kwargs)

    def _place_checkpoints(self, trainer_config, callbacks: list[pl.Callback]) -> list[pl.Callback]:
        """The run's checkpoints go to <default_root_dir>/<run name>/checkpoints (`run_checkpoints`); returns the
        checkpoint callback to add when the config has none."""
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        name = run_checkpoints.run_name(config.get("config") or [], config.get("run_name"))
        directory = run_checkpoints.checkpoint_directory(trainer_config.get("default_root_dir"), name)
        enabled = trainer_config.get("enable_checkpointing") is not False
        added = run_checkpoints.place_checkpoints(callbacks, directory, enabled)
        checkpoints = [cb for cb in [*callbacks, *added] if isinstance(cb, pl.callbacks.ModelCheckpoint)]
        dirpaths = [str(cb.dirpath) for cb in checkpoints if cb.dirpath and is_local(cb.dirpath)]
        self._lock_run_directories({dirpath: dirpath == directory for dirpath in dirpaths})
        if self.subcommand == "fit" and not config.get("ckpt_path"):
            for last in run_checkpoints.earlier_checkpoints([*callbacks, *added]):
                rank_zero_info(
                    f"rlvr: {last} is the checkpoint of an earlier run; this run starts over and overwrites it "
                    "(to continue that run instead, add --ckpt_path last)"
                )
        return added

    def _lock_run_directories(self, directories: dict[str, bool]) -> None:
        """`fit` on global rank 0: lock each checkpoint directory (`run_lock`), or stop with `RunDirectoryLocked`;
        `directories`: each with whether the run's name chose it (else a checkpoint callback's `dirpath` did)."""
        if self.subcommand != "fit" or not is_global_rank_zero():
            return
        for directory, by_name in directories.items():
            if directory in self._run_locks:
                continue
            lock = RunLock(directory) if by_name else RunLock(directory, DIRPATH_TIP)
            dead = lock.acquire()
            self._run_locks[directory] = lock
            if dead:
                rank_zero_info(
                    f"rlvr: {directory} was locked by {describe(dead)}, which is no longer running: "
                    "this run takes it over"
                )

    def _parse_ckpt_path(self) -> None:
        """The config rebuilds the run, not the checkpoint's hyper-parameters (they exclude the policy).

        LightningCLI would re-parse those hyper-parameters as the model config, which fails for
        `--ckpt_path path/to/file.ckpt`; the checkpoint is read by the trainer's checkpoint IO instead,
        which names the file and the reason when it cannot be read."""


def _cli_kwargs(args: list[str] | None, run: bool, exit_on_error: bool = True) -> dict:
    # allow_abbrev off: argparse would take `--trainer.max_epoch` as `--trainer.max_epochs` (a prefix) silently
    parser_kwargs: dict = {"exit_on_error": exit_on_error, "description": DESCRIPTION, "allow_abbrev": False}
    for command in RLVRCLI.subcommands():
        parser_kwargs[command] = {
            "exit_on_error": exit_on_error,
            "allow_abbrev": False,
            "usage": USAGE.format(command=command),
            "description": DESCRIPTIONS.get(command, "") + OPTIONS_HELP.format(command=command),
        }
    return dict(
        model_class=pl.LightningModule,  # RLVRModule, SFTModule, ExpertIterationModule, ... chosen by class_path
        trainer_class=EvalTrainer,  # Lightning's Trainer with `eval`
        datamodule_class=pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_kwargs=parser_kwargs,
        args=args,
        run=run,
    )


def main(args: list[str] | None = None, run: bool = True) -> RLVRCLI:
    """`rlvr ...`; with `run=False` the config is parsed and instantiated but nothing runs (no subcommand).

    Errors propagate as exceptions (a parser error exits with status 2, as jsonargparse does);
    `entry_point` is the console script, which prints configuration mistakes briefly."""
    argv = sys.argv[1:] if args is None else args
    if (problem := config_limit_problem(argv)) is not None:  # before anything reads the configs
        raise ConfigTooLarge(problem.what)
    if argv and argv[0] == "export":
        from rlvr_lightning.cli import export

        return export.main(argv[1:])
    os.environ.setdefault("WANDB_SILENT", "true")
    return RLVRCLI(**_cli_kwargs(args, run))


def entry_point(args: list[str] | None = None) -> int:
    """The `rlvr` console script: 0 on success, 2 for a configuration mistake (a few lines on stderr, no
    traceback unless --debug or RLVR_DEBUG=1), 128 + the signal number when SIGINT/SIGTERM stopped training."""
    argv = list(sys.argv[1:] if args is None else args)
    add_working_directory()  # a class in a file beside the config imports without PYTHONPATH=.
    try:
        apply_malloc_choice()  # the console script's process only: a library leaves malloc alone
    except ValueError as error:
        print(f"rlvr: {error}", file=sys.stderr)
        return 2
    debug, argv = cli_errors.debug_requested(argv)
    if args is None:  # LightningCLI warns when given arguments beside sys.argv's: it reads sys.argv itself
        sys.argv[1:] = argv
    if not debug and (problem := config_limit_problem(argv)) is not None:  # before anything reads the configs
        print(problem.render(), file=sys.stderr)
        return 2
    if argv and argv[0] in EXTRA_COMMANDS:
        return EXTRA_COMMANDS[argv[0]](argv[1:])
    if argv and argv[0] in REMOVED_COMMANDS:
        print(f"error: {REMOVED_COMMANDS[argv[0]]}", file=sys.stderr)
        return 2
    os.environ.setdefault("WANDB_SILENT", "true")
    cli = RLVRCLI.__new__(RLVRCLI)  # built in two steps so that a failure can still read what was parsed
    try:
        cli.__init__(**_cli_kwargs(None if args is None else argv, run=True, exit_on_error=debug))
    except TrainingInterrupted as interrupted:
        return interrupted.code
    except RunDirectoryLocked as locked:
        if debug:
            raise
        print(RunProblem(str(locked), status=2).render(), file=sys.stderr)
        return 2
    except Exception as error:
        if debug:
            raise
        if (run_problem := explain_run_error(error)) is not None:  # a checkpoint missing, unreadable, unwritable
            print(run_problem.render(), file=sys.stderr)
            return run_problem.status
        problem = cli_errors.explain_cli_error(error, cli, argv, RLVRCLI.subcommands())
        if problem is None:
            raise
        print(problem.render(), file=sys.stderr)
        return 2
    return 0
