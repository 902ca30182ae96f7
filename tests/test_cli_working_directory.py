"""`rlvr` finds a class in a file of the directory it runs from, without PYTHONPATH, and leaves it off the path
where Python is asked to (`PYTHONSAFEPATH`)."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from rlvr_lightning.cli.working_directory import add_working_directory

from .cli_runs import SORT

RLVR = Path(sysconfig.get_path("scripts")) / "rlvr"  # the console script `pip install -e .` wrote
MY_LOSS = "from rlvr_lightning.core import PPOClip\n\n\nclass MyLoss(PPOClip):\n    pass\n"


def without_working_directory(path: list[str], here: Path) -> list[str]:
    return [entry for entry in path if os.path.abspath(entry or os.curdir) != str(here)]


def test_the_working_directory_is_appended_once_after_the_installed_packages(in_tmp_dir, monkeypatch):
    before = without_working_directory(sys.path, in_tmp_dir)
    monkeypatch.setattr(sys, "path", list(before))
    assert add_working_directory() == str(in_tmp_dir)
    assert sys.path == [*before, str(in_tmp_dir)]  # last: a file here never shadows an installed package
    assert add_working_directory() is None
    assert sys.path == [*before, str(in_tmp_dir)]


def test_an_entry_that_names_the_working_directory_already_counts(in_tmp_dir, monkeypatch):
    monkeypatch.setattr(sys, "path", ["", *without_working_directory(sys.path, in_tmp_dir)])
    assert add_working_directory() is None


def rlvr(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    assert RLVR.is_file(), f"no console script at {RLVR}: install the package with pip install -e ."
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run(
        [str(RLVR), *args], cwd=cwd, env={**environment, **env}, capture_output=True, text=True, timeout=300
    )


def test_the_console_script_imports_a_class_from_a_file_beside_the_config(tmp_path):
    (tmp_path / "my_loss.py").write_text(MY_LOSS)
    done = rlvr(
        tmp_path, "fit", "--config", SORT, "--model.init_args.loss={class_path: my_loss.MyLoss}", "--print_config"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "class_path: my_loss.MyLoss" in done.stdout


def test_under_pythonsafepath_the_class_is_not_found_and_the_message_says_how_to_import_it(tmp_path):
    (tmp_path / "my_loss.py").write_text(MY_LOSS)
    done = rlvr(
        tmp_path, "fit", "--config", SORT, "--model.init_args.loss={class_path: my_loss.MyLoss}", PYTHONSAFEPATH="1"
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0] == "error: class_path 'my_loss.MyLoss': no module 'my_loss'", done.stderr
    assert (
        f"  my_loss is in {tmp_path}, which is not on Python's path: run with PYTHONPATH=. (docs/extending.md)" in lines
    )
