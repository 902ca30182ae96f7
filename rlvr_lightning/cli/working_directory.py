"""`rlvr` imports a class from a file in the directory it runs from, as `python -m rlvr_lightning.cli` does.

A console script's `sys.path` starts with the script's own folder, not the current directory (Python docs, "The
initialization of the sys.path module search path"), so `class_path: my_reward.MyReward` next to the config would
not import without `PYTHONPATH=.`."""

from __future__ import annotations

import os
import sys


def add_working_directory() -> str | None:
    """Append the current directory to `sys.path`: after the installed packages, so that a file there never shadows
    one of them. Not under `python -P` or `PYTHONSAFEPATH`, which ask for no such entry. The entry added, or None
    where it was on the path already or is not wanted."""
    if getattr(sys.flags, "safe_path", False):
        return None
    here = os.getcwd()
    if any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        return None
    sys.path.append(here)
    return here
