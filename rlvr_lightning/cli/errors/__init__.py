"""Short messages for configuration mistakes on the `rlvr` command line.

Without this, a misspelled option reaches the user as jsonargparse's 60-line usage dump followed
by a nested message, and a value a module rejects as a long traceback ending in a Namespace dump.
`explain_parse_error` and `explain_build_error` turn either into a few lines:

    error: RLVRModule has no option 'clip_hgh'
      at model.init_args.clip_hgh (my.yaml:4)
      did you mean 'clip_high'?
      valid: aggregation, clip_high, clip_low, dual_clip, ...

What is a configuration mistake (short message, exit status 2): any error of the argument parser;
a `ValueError`, `FileNotFoundError` or `ImportError` raised while the configured classes are built;
a `ValueError` raised by a `setup`, `configure_optimizers` or `on_fit_start` hook; Lightning's
`MisconfigurationException`. Everything else keeps its traceback.
"""

from __future__ import annotations

import os
from argparse import ArgumentError

from rlvr_lightning.cli.errors.build_errors import explain_build_error
from rlvr_lightning.cli.errors.early_checks import check_eval_options, check_options_early
from rlvr_lightning.cli.errors.parse_errors import explain_parse_error
from rlvr_lightning.cli.errors.problem import ConfigProblem

__all__ = [
    "ConfigProblem",
    "check_eval_options",
    "check_options_early",
    "debug_requested",
    "explain_build_error",
    "explain_cli_error",
    "explain_parse_error",
    "is_parse_error",
]


def is_parse_error(error: BaseException) -> bool:
    return isinstance(error, ArgumentError)


def debug_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """(`--debug` given or RLVR_DEBUG set, argv without `--debug`)."""
    debug = os.environ.get("RLVR_DEBUG", "").lower() not in ("", "0", "false", "no")
    if "--debug" in argv:
        debug = True
        argv = [arg for arg in argv if arg != "--debug"]
        os.environ["RLVR_DEBUG"] = "1"  # the processes Lightning starts for other ranks rerun the command without it
    return debug, argv


def explain_cli_error(error: Exception, cli, argv: list[str], subcommands) -> ConfigProblem | None:
    """The short message for an error that building or running `cli` (an `RLVRCLI`, perhaps half built) raised
    from `argv`: a parse error against its subcommand's parser, else a build error against the parsed config;
    None when it is not a configuration mistake."""
    if is_parse_error(error):
        command = argv[0] if argv and argv[0] in subcommands else None
        parsers = getattr(cli, "_subcommand_parsers", {})
        return explain_parse_error(str(error), argv, parsers.get(command))
    config = getattr(cli, "config", None)
    if config is not None and config.get("subcommand"):
        config = config[config["subcommand"]]
    return explain_build_error(error, argv, config, during_setup=hasattr(cli, "trainer"))
