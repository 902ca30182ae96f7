"""`rlvr serve`: the vLLM server command it runs, and how it stops it (vLLM itself runs in tests/engines)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import yaml

from rlvr_lightning.cli.app import entry_point
from rlvr_lightning.serving import serve


def test_rlvr_serve_runs_vllms_server_with_the_worker_extension(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    policy = {"class_path": "HFPolicy", "init_args": {"model": {"name_or_path": str(tmp_path)}}}
    config.write_text(yaml.safe_dump({"model": {"init_args": {"policy": policy}}}))
    calls = []
    monkeypatch.setattr(serve, "run_until_stopped", lambda argv, env, stop: calls.append((argv[0], argv, env)))
    entry_point(["serve", "--config", str(config), "--port", "8011", "--", "--max-model-len", "512"])
    ((path, argv, env),) = calls
    assert argv[0] == path and argv[1:5] == [
        "-W",
        "ignore::DeprecationWarning",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    joined = " ".join(argv)
    assert f"--model {tmp_path} --host 127.0.0.1 --port 8011 --dtype float32" in joined
    assert "--worker-extension-cls rlvr_lightning.serving.server_worker.WeightReceiver" in joined
    assert "--logprobs-mode processed_logprobs --generation-config vllm --load-format dummy" in joined
    assert argv[-2:] == ["--max-model-len", "512"]  # after `--`: passed to vLLM as they are
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # the /collective_rpc endpoint the weight pushes use


def test_a_config_without_a_model_path_says_what_to_pass(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"init_args": {}}}))
    with pytest.raises(SystemExit, match="names no model.init_args.policy.init_args.model.name_or_path; pass --model"):
        serve.main(["--config", str(config)])


def test_max_lora_rank_serves_an_adapter_the_trainer_can_register(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(serve, "run_until_stopped", lambda argv, env, stop: calls.append((argv[0], argv, env)))
    serve.main(["--model", str(tmp_path), "--max-lora-rank", "8"])
    ((_, argv, env),) = calls
    assert "--enable-lora --max-lora-rank 8 --max-loras 1" in " ".join(argv)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"  # opens /v1/load_lora_adapter
    with pytest.raises(SystemExit):
        serve.main(["--model", str(tmp_path), "--max-lora-rank", "4"])  # not a rank vLLM accepts
    assert "argument --max-lora-rank: invalid choice: 4 (choose from 1, 8, 16" in capsys.readouterr().err


# A stand-in for vLLM's server: a child process below it, and Ctrl-C handled as `handling` says.
SERVER = """
import signal, subprocess, sys, time
children = []
if "{handling}" == "ignore":  # vLLM's HTTP server waiting for a request handler that never returns
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    signal.signal(signal.SIGINT, lambda *_: ([c.kill() for c in children], sys.exit(3)))
children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
print(children[0].pid, flush=True)  # Ctrl-C is handled from here on
time.sleep(600)
"""


def _stopped(handling: str, stop_timeout_s: float, signals: int = 1) -> tuple[int, float, str]:
    """Run the stand-in under `run_until_stopped` in a child Python; send that `signals` SIGINTs; its exit code, the
    seconds it took to exit after the first, and its stderr."""
    script = textwrap.dedent(f"""
        import sys
        from rlvr_lightning.serving.serve import run_until_stopped
        server = [sys.executable, "-c", {SERVER.format(handling=handling)!r}]
        sys.exit(run_until_stopped(server, None, {stop_timeout_s}))
    """)
    supervisor = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    grandchild = int(supervisor.stdout.readline())
    started = time.monotonic()
    for _ in range(signals):
        supervisor.send_signal(signal.SIGINT)
        time.sleep(0.5)
    supervisor.wait(timeout=60)
    seconds = time.monotonic() - started
    deadline = time.monotonic() + 10
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the server's child was left running"
        time.sleep(0.1)
    return supervisor.returncode, seconds, supervisor.stderr.read()


def test_a_server_that_stops_on_ctrl_c_returns_its_exit_code_at_once():
    code, seconds, stderr = _stopped("exit", stop_timeout_s=30)
    assert (code, "killing" in stderr) == (3, False), (code, seconds, stderr)
    assert seconds < 10


def test_a_server_that_does_not_stop_is_killed_with_its_children_after_the_stop_timeout():
    code, seconds, stderr = _stopped("ignore", stop_timeout_s=2)
    assert code == 128 + signal.SIGKILL and 2 <= seconds < 15
    assert "rlvr serve: vLLM did not stop; killing its processes (2 s after the signal)" in stderr


def test_a_second_ctrl_c_kills_the_server_at_once():
    code, seconds, stderr = _stopped("ignore", stop_timeout_s=300, signals=2)
    assert code == 128 + signal.SIGKILL and seconds < 15 and "(a second signal)" in stderr
