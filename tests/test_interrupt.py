"""Ctrl-C (SIGINT) or a scheduler's SIGTERM: `rlvr fit` saves last.ckpt at the end of the step in progress,
exits with 128 + the signal number, and `--ckpt_path last` resumes bitwise where an uninterrupted run is.

The interrupted runs are real `rlvr fit` subprocesses (the setup of tests/test_resume.py: Adam, LR scheduler,
KL reference refreshed every 3 steps, dynamic sampling, sampled validation, checkpoints every 2 rollout
steps). Each waits at the start of step K = 6 until the test has sent the signal, so the signal arrives
in the middle of a step; the checkpoint it leaves is the one of step K (7 steps done), which no periodic
save writes. A second SIGINT stops at once without saving.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from rlvr_lightning.cli.app import main
from tests.test_resume import EPOCHS, STEPS_PER_EPOCH, K, config, logged, parameters

WAITER = '''
import os, time
import torch
from lightning.pytorch import Callback
torch.set_num_threads(1)

class WaitForGo(Callback):
    """At the start of rollout step `step` (0-based), write `marker` and wait until the file `go` exists."""
    def __init__(self, step: int, marker: str, go: str):
        self.step, self.marker, self.go = step, marker, go
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.fit_loop.epoch_loop._batches_that_stepped == self.step:
            open(self.marker, "w").close()
            while not os.path.exists(self.go):
                time.sleep(0.02)
'''


def start(tmp_path: Path, name: str) -> subprocess.Popen:
    (tmp_path / "waiter.py").write_text(WAITER)
    waiter = f"""    - class_path: waiter.WaitForGo
      init_args: {{step: {K}, marker: {tmp_path / name}.waiting, go: {tmp_path / name}.go}}"""
    cfg = config(tmp_path, name, False, waiter)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(cfg)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / f"{name}.stderr", "w"),
    )


def interrupt(process: subprocess.Popen, tmp_path: Path, name: str, *signals: int) -> int:
    """Wait until the run waits at step K, send `signals`, let the step go on, and return the exit status."""
    marker, deadline = tmp_path / f"{name}.waiting", time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None, (tmp_path / f"{name}.stderr").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach step K"
        time.sleep(0.05)
    for signum in signals:
        os.kill(process.pid, signum)
        time.sleep(0.5)  # each signal is handled before the next one is sent
    (tmp_path / f"{name}.go").touch()
    return process.wait(timeout=120)


def steps_in(checkpoint: Path) -> int:
    """Rollout steps completed when the checkpoint was written."""
    state = torch.load(checkpoint, weights_only=False)
    return state["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] + 1


def test_sigint_and_sigterm_save_and_resume_bitwise_a_second_sigint_stops_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {name: start(tmp_path, name) for name in ("sigint", "sigterm", "twice")}  # run while the reference trains

    full = main(["fit", "--config", str(config(tmp_path, "full", False))])
    expected = parameters(full.model)
    full_log = logged(tmp_path, "full")
    assert sorted(full_log) == list(range(STEPS_PER_EPOCH * EPOCHS))

    codes = {
        "sigint": interrupt(runs["sigint"], tmp_path, "sigint", signal.SIGINT),
        "sigterm": interrupt(runs["sigterm"], tmp_path, "sigterm", signal.SIGTERM),
        "twice": interrupt(runs["twice"], tmp_path, "twice", signal.SIGINT, signal.SIGINT),
    }
    assert codes == {"sigint": 128 + signal.SIGINT, "sigterm": 128 + signal.SIGTERM, "twice": 1}, {
        name: (tmp_path / f"{name}.stderr").read_text()[-2000:] for name in codes
    }
    assert (
        steps_in(tmp_path / "ckpt_twice" / "last.ckpt") == K
    )  # the periodic save of step K - 1: nothing saved on exit

    for name, signum in (("sigint", signal.SIGINT), ("sigterm", signal.SIGTERM)):
        last = tmp_path / f"ckpt_{name}" / "last.ckpt"
        stderr = (tmp_path / f"{name}.stderr").read_text()
        assert f"rlvr: {signal.Signals(signum).name}: saved {last} after rollout step {K + 1}" in stderr
        assert "Traceback" not in stderr
        assert steps_in(last) == K + 1  # the step the signal arrived in was finished, then saved
        assert logged(tmp_path, name) == {step: full_log[step] for step in range(K + 1)}  # its metrics were flushed

        resumed_cfg = config(tmp_path, f"resumed_{name}", False)
        resumed_cfg.write_text(resumed_cfg.read_text().replace(f"ckpt_resumed_{name}", f"ckpt_{name}"))
        resumed = main(["fit", "--config", str(resumed_cfg), "--ckpt_path", "last"])
        actual = parameters(resumed.model)
        for key in expected:
            assert torch.equal(expected[key], actual[key]), (name, key)  # bitwise, policy and reference
        resumed_log = logged(tmp_path, f"resumed_{name}")
        assert sorted(resumed_log) == list(range(K + 1, STEPS_PER_EPOCH * EPOCHS))
        assert resumed_log == {step: full_log[step] for step in resumed_log}
