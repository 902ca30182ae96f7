#!/usr/bin/env python
"""Weight pushes of a LoRA policy to vLLM, adapter alone against merged weights: SmolLM2-135M-Instruct, LoRA r = 8.

Legs (each its own engine; the policy's adapter changes before every push, as an update changes it):

* `colocated_adapter` / `colocated_merged`: `VLLMGeneration(lora_sync=adapter|merged)` in this process;
* `server_adapter` / `server_merged`: `ServerGeneration(lora_sync=adapter|merged)` against a
  `rlvr serve` on localhost each (the adapter's with `--max-lora-rank`), weights as a file in /dev/shm.

Each round pushes once per leg, interleaved; the first push of each leg (the engine's start, the base weights)
is not counted. Per leg the script prints the bytes sent per push, the medians of the push's wall-clock and CPU
seconds (this process's, plus the server's processes' for the server legs), and of a short generation after
the push (LoRA kernels cost decoding time), and the ratio merged / adapter. One torch thread.

    /work/venv-vllm/bin/python scripts/bench_lora_push.py --rounds 5 --where colocated server
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["What is 12 + 30?", "Name three colours.", "Sort: 3 1 2", "Say hello."]


def process_tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and its descendants (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model: str, rank: int | None, log_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "rlvr_lightning.serving.serve", "--model", model, "--port", str(port)]
    command += ["--max-lora-rank", str(rank)] if rank else []
    command += ["--", "--kv-cache-memory-bytes", str(256 << 20), "--enforce-eager", "--max-model-len", "512"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="WARNING")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    log = open(log_dir / f"server_{port}.log", "w")  # noqa: SIM115 (the server's lifetime)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return process, f"127.0.0.1:{port}"


def make_leg(name: str, model: str, rank: int, servers: dict[str, str]):
    from rlvr_lightning.policies import ServerGeneration, VLLMGeneration
    from rlvr_lightning.policies.hf import HFPolicy

    mode = name.rsplit("_", 1)[1]
    if name.startswith("colocated"):
        backend = VLLMGeneration(dtype="float32", kv_cache_memory_gib=0.25, max_model_len=512, lora_sync=mode)
    else:
        backend = ServerGeneration(servers=[servers[mode]], lora_sync=mode)
    torch.manual_seed(0)
    return HFPolicy(
        model=HFModelOptions(name_or_path=model),
        lora=LoRAOptions(r=rank, alpha=2 * rank),
        generation=GenerationOptions(backend=backend),
    )


def move_adapter(policy, generator: torch.Generator) -> None:
    """An update's worth of change: every adapter tensor moves (lora_B starts at zero)."""
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_" in name and ".default." in name:
                param.add_(torch.randn(param.shape, generator=generator) * 1e-3)


def measure(policy, generator, server_pid: int | None, new_tokens: int) -> dict[str, float]:
    from rlvr_lightning.policies import SamplingConfig

    move_adapter(policy, generator)
    backend = policy.generation
    cpu, server_cpu = time.process_time(), process_tree_cpu_seconds(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    backend.push_weights(policy.model, policy.tokenizer)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu + (process_tree_cpu_seconds(server_pid) - server_cpu if server_pid else 0.0)
    decode = 0.0
    if new_tokens:
        sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0)
        started = time.perf_counter()
        policy.sample({"prompt": PROMPTS}, 2, sampling)
        decode = time.perf_counter() - started
    return {"bytes": backend._weights.last_bytes, "wall": wall, "cpu": cpu, "decode": decode}


def table(results: dict[str, list[dict[str, float]]]) -> str:
    def median(leg: str, key: str) -> float:
        return statistics.median(row[key] for row in results[leg])

    lines = [
        "| leg | bytes per push | push wall s (median) | push CPU s (median) | generation s (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for leg in results:
        lines.append(
            f"| {leg} | {median(leg, 'bytes') / 1e6:,.2f} MB | {median(leg, 'wall'):.3f} | "
            f"{median(leg, 'cpu'):.3f} | {median(leg, 'decode'):.2f} |"
        )
    lines += ["", "| where | bytes merged / adapter | push wall merged / adapter | push CPU merged / adapter |"]
    lines.append("|---|---:|---:|---:|")
    for where in ("colocated", "server"):
        if f"{where}_adapter" in results:
            ratio = [median(f"{where}_merged", k) / median(f"{where}_adapter", k) for k in ("bytes", "wall", "cpu")]
            lines.append(f"| {where} | {ratio[0]:.1f}x | {ratio[1]:.1f}x | {ratio[2]:.1f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a directory or an rlvr-models alias")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens of the generation after each push (0: none)")
    parser.add_argument("--where", nargs="+", choices=["colocated", "server"], default=["colocated", "server"])
    parser.add_argument("--startup-timeout", type=float, default=1800, help="seconds a server may take to start")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from rlvr_lightning.runtime.model_cache import resolve_model_path
    from rlvr_lightning.runtime.run_environment import environment_record

    model = resolve_model_path(args.model)
    legs = [f"{where}_{mode}" for where in args.where for mode in ("adapter", "merged")]
    processes: dict[str, subprocess.Popen] = {}
    servers: dict[str, str] = {}
    try:
        if "server" in args.where:  # both start at once
            from rlvr_lightning.serving.client import RolloutServerClient

            log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
            for mode, rank in (("adapter", args.rank), ("merged", None)):
                processes[mode], servers[mode] = start_server(model, rank, log_dir)
            for address in servers.values():
                RolloutServerClient(address).wait_until_ready(args.startup_timeout)
        policies = {leg: make_leg(leg, model, args.rank, servers) for leg in legs}
        generator = torch.Generator().manual_seed(0)
        pids = {leg: processes[leg.rsplit("_", 1)[1]].pid if leg.startswith("server") else None for leg in legs}
        for leg in legs:  # the engine's start and the base weights: not counted
            measure(policies[leg], generator, pids[leg], 0)
        results: dict[str, list[dict[str, float]]] = {leg: [] for leg in legs}
        for round_index in range(args.rounds):
            for leg in legs if round_index % 2 == 0 else reversed(legs):
                results[leg].append(measure(policies[leg], generator, pids[leg], args.new_tokens))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for process in processes.values():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    record = environment_record()
    cpu = record["machine"].get("cpu", "")
    print(f"# {time.strftime('%Y-%m-%d', time.gmtime())}, {cpu}, torch threads 1, {args.rounds} rounds")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
