"""`explain_run_error`: an error of the run's files (a checkpoint that is missing, unreadable or cannot be
written) as a few lines and an exit status, or None for any other error.

    error: cannot write checkpoint runs/grpo/checkpoints/last.ckpt: No space left on device
      in runs/grpo/checkpoints: the checkpoint needs about 1.6 GB, 0.2 GB free (...); the previous checkpoint is intact
      (run again with --debug (or RLVR_DEBUG=1) for the full message and traceback)

A checkpoint that is missing or unreadable is a mistake on the command line (status 2, like a configuration
mistake); one that cannot be written is not (status 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr_lightning.checkpoint_files import CheckpointNotFoundError, CheckpointReadError, CheckpointWriteError
from rlvr_lightning.cli_errors.problem import DEBUG_HINT

STATUS = {CheckpointNotFoundError: 2, CheckpointReadError: 2, CheckpointWriteError: 1}


@dataclass
class RunProblem:
    message: str  # the exception's message: its first line is what went wrong, the others the details
    status: int

    def render(self) -> str:
        first, *rest = self.message.strip().splitlines() or [""]
        return "\n".join([f"error: {first}", *(f"  {line}" for line in rest[:2]), f"  ({DEBUG_HINT})"])


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
