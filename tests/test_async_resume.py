"""Exact resume with asynchronous rollouts: `tests/test_resume.py`'s SIGKILL run with `rollout_staleness: 1`.

The rollout sampled during the last update before the checkpoint (batch K-1's, to be trained on at step K)
is in `last.ckpt`; the resumed run trains on it and ends bitwise where the uninterrupted run ends.
"""

from __future__ import annotations

import torch

from rlvr_lightning.cli.app import main

from . import test_resume
from .test_resume import EPOCHS, STEPS_PER_EPOCH, K, kill_when_waiting, logged, parameters, start_killed_run

SYNC_CONFIG = test_resume.config


def async_config(tmp_path, name: str, with_filter: bool = False, extra_callbacks: str = "", ppo: bool = False):
    path = SYNC_CONFIG(tmp_path, name, with_filter, extra_callbacks, ppo)
    path.write_text(path.read_text().replace("    group_size: 4\n", "    group_size: 4\n    rollout_staleness: 1\n"))
    return path


def test_sigkill_then_resume_with_a_rollout_in_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(test_resume, "config", async_config)  # the killed run's config too
    process, marker = start_killed_run(tmp_path, "killed", with_filter=False)

    full = main(["fit", "--config", str(async_config(tmp_path, "full"))])
    expected = parameters(full.model)
    kill_when_waiting(process, marker, tmp_path, "killed")

    checkpoint = torch.load(tmp_path / "ckpt_killed" / "last.ckpt", weights_only=False)
    assert checkpoint["hyper_parameters"]["rollout_staleness"] == 1
    (ready,) = checkpoint["rlvr_async_rollouts"]["queue"]
    assert ready["rollout"]["response_ids"].shape[0] == 8 * 4 and ready["rollout"]["sampling_log_probs"] is not None

    resumed_cfg = async_config(tmp_path, "resumed")
    resumed_cfg.write_text(resumed_cfg.read_text().replace("ckpt_resumed", "ckpt_killed"))
    resumed = main(["fit", "--config", str(resumed_cfg), "--ckpt_path", "last"])
    actual = parameters(resumed.model)
    for key, value in expected.items():
        assert torch.equal(value, actual[key]), key  # bitwise, policy and reference
    full_log, killed_log, resumed_log = (logged(tmp_path, n) for n in ("full", "killed", "resumed"))
    total = STEPS_PER_EPOCH * EPOCHS
    assert sorted(full_log) == list(range(1, total))  # step 0 samples only
    assert sorted(resumed_log) == list(range(K, total))
    assert resumed_log == {step: full_log[step] for step in resumed_log}
    assert killed_log == {step: full_log[step] for step in range(1, K)}
