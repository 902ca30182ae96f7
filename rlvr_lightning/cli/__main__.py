import sys

from rlvr_lightning.cli import entry_point

sys.exit(entry_point())
