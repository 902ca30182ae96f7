"""`explain_run_error`: an error of the run's files (a checkpoint that is missing, unreadable or cannot be
written), of its rollout servers (unreachable, dead, timed out), or a row longer than `update.micro_batch_tokens`,
as a few lines and an exit status, or None for any other error; `explain_export_error`: the same for a misuse of
`rlvr export`.

    error: cannot write checkpoint runs/grpo/checkpoints/last.ckpt: No space left on device
      in runs/grpo/checkpoints: the checkpoint needs about 1.6 GB, 0.2 GB free (...); the previous checkpoint is intact
      (run again with --debug (or RLVR_DEBUG=1) for the full message and traceback)

A checkpoint that is missing or unreadable is a mistake on the command line (status 2, like a configuration
mistake); one that cannot be written is not (status 1).
"""

from __future__ import annotations

import os
import traceback
from argparse import ArgumentError
from dataclasses import dataclass

from rlvr_lightning.cli.errors.problem import DEBUG_HINT
from rlvr_lightning.modules.update.micro_batches import TokenBudgetError
from rlvr_lightning.runtime.checkpoint_files import CheckpointNotFoundError, CheckpointReadError, CheckpointWriteError
from rlvr_lightning.serving.client import RolloutServerError

# a token budget smaller than a row is a configuration mistake found once the rows exist: status 2 as well;
# a rollout server that cannot be reached, died or timed out stops the run (status 1): its checkpoint is intact
STATUS = {
    CheckpointNotFoundError: 2,
    CheckpointReadError: 2,
    CheckpointWriteError: 1,
    TokenBudgetError: 2,
    RolloutServerError: 1,
}
MAX_LINE = 400
EXPORT_USAGE = (
    "usage: rlvr export --config CONFIG --ckpt_path CKPT --output_dir DIR (rlvr export --help lists the options)"
)
# files whose errors are about the arguments of `rlvr export` (its checkpoint, its output directory, the policy)
EXPORT_FILES = (
    os.path.join("rlvr_lightning", "cli/export.py"),
    os.path.join("rlvr_lightning", "runtime/checkpoint_files.py"),
)


@dataclass
class RunProblem:
    message: str  # the exception's message: its first line is what went wrong, the others the details
    status: int

    def render(self) -> str:
        first, *rest = self.message.strip().splitlines() or [""]
        lines = [f"error: {first}", *(f"  {line.strip()}" for line in rest[:2]), f"  ({DEBUG_HINT})"]
        return "\n".join(line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..." for line in lines)


def explain_run_error(error: BaseException) -> RunProblem | None:
    """A `RunProblem` for a checkpoint error anywhere in `error`'s chain of causes, else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for kind, status in STATUS.items():
            if isinstance(current, kind):
                return RunProblem(str(current), status)
        current = current.__cause__ or current.__context__
    return None


def explain_export_error(error: BaseException) -> RunProblem | None:
    """A `RunProblem` (status 2) for a misuse of `rlvr export`: a parse error, or an error `cli/export.py` or the
    checkpoint reader raised about the arguments; None for anything else."""
    if isinstance(error, ArgumentError):
        return RunProblem(f"{str(error).strip().splitlines()[-1]}\n{EXPORT_USAGE}", 2)
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, (OSError, TypeError, ValueError, RuntimeError)) and frames:
        if frames[-1].filename.endswith(EXPORT_FILES):
            return RunProblem(str(error), 2)
    return None
