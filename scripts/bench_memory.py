"""Memory per rank of the same training run under DDP and under FSDP2 (`strategy: fsdp2`).

Each leg is one `SFTModule` run of `--steps` optimizer steps (AdamW, `--batch` pairs of `--tokens`
response tokens per rank) on `--world_size` processes, started once per leg as torchrun would
start them. A callback measures on every rank, after the last step:

* parameters, gradients, optimizer state: bytes of the tensors this rank holds (for FSDP2 its
  shards: `DTensor.to_local()`), gradients just before the optimizer step;
* activations: bytes of the distinct storages autograd saved for backward during a training step,
  without parameters and views of them (what the forward keeps alive until backward);
* peak: `torch.cuda.max_memory_allocated` on a GPU; on a CPU the process's peak resident set
  (`ru_maxrss`), which includes Python, torch and the libraries (~0.5-1 GB), so it compares legs,
  not tensors.

    python scripts/bench_memory.py                                   # SmolLM2-135M-Instruct (rlvr-models fetch ...)
    python scripts/bench_memory.py --model tiny                      # a random 2-layer Llama, seconds
    python scripts/bench_memory.py --model qwen2.5-1.5b-random --accelerator gpu   # Qwen2.5-1.5B-shaped, random weights

It prints one row per leg and rank and the FSDP2 / DDP ratio of parameters + optimizer state
(ideally 1 / world_size: every rank keeps 1/world_size of each).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlvr_lightning.demos.model_shapes import QWEN2_5_1_5B
from rlvr_lightning.policies.hf_options import HFModelOptions

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]

MB = 2**20
LEGS = ("ddp", "fsdp2")


def _nbytes(tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _probe_class():
    import lightning.pytorch as pl
    import torch

    class MemoryProbe(pl.Callback):
        """Per-rank tensor bytes: parameters, gradients, optimizer state, activations saved for backward."""

        def __init__(self, out: str) -> None:
            self.out, self.grads, self.activations = out, 0, 0
            self._hooks = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            seen: dict[int, int] = {}

            def pack(tensor):
                base = tensor._base if tensor._base is not None else tensor  # a weight's transpose is the weight
                is_parameter = base.is_leaf and base.requires_grad
                if not is_parameter and tensor.device.type != "meta":
                    storage = tensor.untyped_storage()
                    seen[storage.data_ptr()] = storage.nbytes()
                return tensor

            self._seen = seen
            self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
            self._hooks.__enter__()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if self._hooks is not None:  # forward and backward are done: stop counting
                self._hooks.__exit__(None, None, None)
                self._hooks = None
                self.activations = max(self.activations, sum(self._seen.values()))
            self.grads = sum(_nbytes(p.grad) for p in pl_module.parameters() if p.grad is not None)

        def on_train_end(self, trainer, pl_module):
            optimizer = trainer.optimizers[0]
            state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            if torch.cuda.is_available():
                peak = torch.cuda.max_memory_allocated()
            else:
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
            row = {
                "rank": trainer.global_rank,
                "parameters": sum(_nbytes(p) for p in pl_module.parameters()),
                "gradients": self.grads,
                "optimizer": sum(_nbytes(v) for v in state),
                "activations": self.activations,
                "peak": peak,
                "peak_kind": "cuda_allocated" if torch.cuda.is_available() else "cpu_rss",
            }
            Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(row))

    return MemoryProbe


def _policy(args, work: Path) -> dict:
    if args.model == "tiny":
        from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config

        tokenizer = save_tiny_tokenizer(work / "tokenizer")
        return {
            "config": tiny_llama_config(hidden_size=256, intermediate_size=512, num_hidden_layers=4),
            "tokenizer": str(tokenizer),
        }
    if args.model == "qwen2.5-1.5b-random":
        # Qwen2.5-1.5B's shape, random weights; the tokenizer is SmolLM2's (vocab 49k <= 151k)
        return {"config": QWEN2_5_1_5B, "tokenizer": "smollm2-135m-instruct"}
    return {"name_or_path": args.model}


def worker(args) -> None:
    import lightning.pytorch as pl
    import torch

    from rlvr_lightning.data.sft_data import SFTDataModule
    from rlvr_lightning.modules import SFTModule
    from rlvr_lightning.policies.hf import HFPolicy

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    pl.seed_everything(0)
    policy = HFPolicy(
        model=HFModelOptions(
            dtype="float32", gradient_checkpointing=args.gradient_checkpointing, **json.loads(args.policy)
        ),
    )
    words = " ".join(f"w{i}" for i in range(args.tokens))  # ~tokens response tokens
    pairs = out / f"pairs{os.environ['RANK']}.jsonl"  # the same pairs, one file per rank (no rank waits for another)
    pairs.write_text("".join(json.dumps({"prompt": f"Say {i}", "response": words}) + "\n" for i in range(64)))
    module = SFTModule(policy, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-5))
    data = SFTDataModule(str(pairs), batch_size=args.batch)
    trainer = pl.Trainer(
        strategy=args.leg,
        accelerator=args.accelerator,
        devices=args.world_size,
        max_steps=args.steps,
        precision=args.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_probe_class()(str(out))],
    )
    trainer.fit(module, datamodule=data)


def run_leg(args, leg: str, policy: dict, work: Path) -> list[dict]:
    out = work / leg
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(args.world_size),
        "NODE_RANK": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": str(args.threads),
    }
    command = [
        sys.executable,
        __file__,
        "--worker",
        "--leg",
        leg,
        "--out",
        str(out),
        "--policy",
        json.dumps(policy),
        *[
            f"--{k}={getattr(args, k)}"
            for k in ("steps", "batch", "tokens", "threads", "precision", "accelerator", "world_size")
        ],
        *(["--gradient_checkpointing"] if args.gradient_checkpointing else []),
    ]
    processes = [
        subprocess.Popen(
            command,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=open(out / f"rank{r}.log", "w"),
        )
        for r in range(args.world_size)
    ]
    while any(process.poll() is None for process in processes):
        failed = [r for r, process in enumerate(processes) if process.poll() not in (None, 0)]
        if failed:  # the others would wait for it forever
            for process in processes:
                process.kill()
            raise RuntimeError(f"{leg} rank {failed[0]} failed:\n" + (out / f"rank{failed[0]}.log").read_text()[-3000:])
        time.sleep(0.2)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.world_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="tiny, qwen2.5-1.5b-random, or an HFPolicy model.name_or_path"
    )
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2, help="pairs per rank and step")
    parser.add_argument("--tokens", type=int, default=64, help="about this many response tokens per pair")
    # fp32 weights always (training refuses bf16 trainable weights); bf16-mixed computes in bf16 over them
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--leg", choices=LEGS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        policy = _policy(args, work)
        results = {leg: run_leg(args, leg, policy, work) for leg in LEGS}
    print(
        f"model {args.model}, {args.world_size} ranks, {args.batch} pairs x ~{args.tokens} tokens per rank, "
        f"{args.precision}, AdamW; MB per rank"
    )
    print(
        f"{'leg':6} {'rank':>4} {'params':>9} {'grads':>9} {'optim':>9} {'params+optim':>13} {'activations':>12} "
        f"{'peak':>9}  peak is"
    )
    for leg, rows in results.items():
        for row in rows:
            mb = {key: row[key] / MB for key in ("parameters", "gradients", "optimizer", "activations", "peak")}
            print(
                f"{leg:6} {row['rank']:>4} {mb['parameters']:9.1f} {mb['gradients']:9.1f} {mb['optimizer']:9.1f} "
                f"{mb['parameters'] + mb['optimizer']:13.1f} {mb['activations']:12.1f} {mb['peak']:9.1f}  "
                f"{row['peak_kind']}"
            )
    worst = {leg: max(r["parameters"] + r["optimizer"] for r in rows) for leg, rows in results.items()}
    print(f"params + optimizer state, FSDP2 / DDP (largest rank): {worst['fsdp2'] / worst['ddp']:.3f}")


if __name__ == "__main__":
    main()
