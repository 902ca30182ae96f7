"""The `rlvr` command (`app.py`: fit, validate, predict; `export.py`: rlvr export), and the few lines it prints
for a configuration mistake (`errors/`). `python -m rlvr_lightning.cli` is `rlvr`."""

from rlvr_lightning.cli.app import RLVRCLI, entry_point, main

__all__ = ["RLVRCLI", "entry_point", "main"]
