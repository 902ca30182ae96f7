"""A two-process gloo `rlvr fit` for the DDP tests: a recorder callback module beside the config, each rank's
record read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def fit_two_ranks(tmp_path: Path, recorder: str, recorder_source: str, config: str) -> list[dict]:
    """Run `rlvr fit` on `config` (YAML text) in `tmp_path`, with module `recorder` (`recorder_source`) and the
    data tests' helpers importable; the JSON each rank's recorder wrote to `tmp_path/rank{r}.json`."""
    (tmp_path / f"{recorder}.py").write_text(recorder_source)
    (tmp_path / "ddp.yaml").write_text(config)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS / "data"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(tmp_path / "ddp.yaml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
