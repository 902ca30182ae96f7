#!/usr/bin/env python
"""Time and memory of one training step on SmolLM2: GRPO next to PPO with a separate critic and PPO with a
value head on the policy's trunk.

    python scripts/bench_ppo.py                       # 2 rounds x 3 legs, 1 warm-up + 2 timed steps per leg
    python scripts/bench_ppo.py --rounds 1 --steps 2 --legs grpo ppo_shared

The work is `scripts/bench_step.py`'s `smollm2` case: SmolLM2-135M-Instruct in fp32 (needs
`rlvr-models fetch smollm2-135m-instruct`), 2 chat prompts x 8 completions x exactly 32 new tokens (EOS
suppressed until then), temperature 1, one inner epoch over one mini-batch, token-mean ppo_clip, fused
AdamW (lr 1e-5, the critic's too), gradient norm clipped at 1, no KL. GRPO's advantages are group-normalised;
PPO's are GAE (gamma = lam = 1) from the critic, whitened.

Each leg runs in a fresh subprocess (so its peak resident memory is its own) with torch on `--threads`
threads; the legs alternate within each round, so a busy machine slows them alike. Printed per leg: the
median step time over the timed steps of every round and its parts (generation; advantages, which for PPO
includes the critic's forward over the rollout; the update: log-probs / values, backward, optimizer), the
process's CPU time per step, the resident memory when training starts (weights loaded) and its peak
during training (Linux `VmHWM`, reset when training starts: weights, gradients, optimizer state and the
step's activations, plus Python, torch and transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rlvr_lightning.core.losses.policy_losses import PPOClip  # noqa: E402
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig  # noqa: E402
from rlvr_lightning.modules.ppo_options import ValueConfig  # noqa: E402
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions
from rlvr_lightning.runtime.timing import clock  # noqa: E402  (waits for the device's queued work before reading the time)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["What is 12 + 7? Answer with a number.", "Name a prime number larger than 10."]
GENERATIONS, NEW_TOKENS, LR = 8, 32, 1e-5
LEGS = ("grpo", "ppo_separate", "ppo_shared")
SECTIONS = ("generation_s", "advantages_s", "update_s")


def run_leg(leg: str, steps: int, seed: int, threads: int) -> dict:
    """One leg in this process: `steps` training steps; per-step times and the process's peak memory."""
    import functools

    import lightning.pytorch as pl
    import torch

    from rlvr_lightning.advantages import GroupNormalizedAdvantage
    from rlvr_lightning.data.datamodule import RLVRDataModule
    from rlvr_lightning.data.inline_task import InlineTask
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.modules import PPOModule, RLVRModule
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.rewards.base import RewardCallback
    from rlvr_lightning.runtime.model_cache import is_fetched, model_dir

    if not is_fetched("smollm2-135m-instruct"):
        raise SystemExit("SmolLM2 is not fetched: run `rlvr-models fetch smollm2-135m-instruct` first")
    torch.set_num_threads(threads)

    class DigitReward(RewardCallback):  # bench_step.py's reward: the fraction of characters that are digits
        def score(self, rollout):
            return torch.tensor([sum(c.isdigit() for c in t) / max(len(t), 1) for t in rollout.response_text])

    steps_log: list[dict] = []

    memory: dict[str, float] = {}

    class Timing(pl.Callback):
        def on_train_start(self, *args):
            memory["start_rss_gb"] = _status_gb("VmRSS")
            _reset_peak_rss()

        def on_train_batch_start(self, trainer, module, *args):
            self.started, self.cpu = clock(module.device), time.process_time()

        def on_train_batch_end(self, trainer, module, *args):
            step = {"step_s": clock(module.device) - self.started, "cpu_s": time.process_time() - self.cpu}
            step.update({f"{k}_s": module.section_times.get(k, 0.0) for k in ("generation", "advantages", "update")})
            module.section_times.clear()
            steps_log.append(step)

    pl.seed_everything(seed, verbose=False)
    policy = HFPolicy(
        model=HFModelOptions(name_or_path=str(model_dir("smollm2-135m-instruct")), dtype="float32"),
        generation=GenerationOptions(min_new_tokens=NEW_TOKENS),
    )
    options = dict(
        optimizer=functools.partial(torch.optim.AdamW, lr=LR, weight_decay=0.0, fused=True),
        group_size=GENERATIONS,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=NEW_TOKENS),
        loss=PPOClip(clip_low=0.2, clip_high=0.2),
        aggregation=AggregationConfig(mode="token-mean"),
        update=UpdateConfig(epochs=1, max_grad_norm=1.0),
    )
    callbacks = [DigitReward(), Timing()]
    if leg == "grpo":
        module = RLVRModule(policy, **options)
        callbacks.append(GroupNormalizedAdvantage())
    else:
        module = PPOModule(policy, value=ValueConfig(model=leg.removeprefix("ppo_"), lr=LR), **options)
    module.section_times = {}
    _time(module, policy, "sample", "generation")
    _time(module, module, "_advantages", "advantages")
    _time(module, module, "_update", "update")
    data = RLVRDataModule(InlineTask(examples=[{"prompt": p} for p in PROMPTS], seed=seed), batch_size=len(PROMPTS))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(module, datamodule=data)
    lengths = policy.last_generation_stats
    assert lengths["response_length/min"] == lengths["response_length/max"] == NEW_TOKENS, lengths
    critic = getattr(module, "critic", None)
    return {
        "leg": leg,
        "steps": steps_log,
        "start_rss_gb": memory["start_rss_gb"],
        "peak_rss_gb": _status_gb("VmHWM"),
        "policy_params_m": sum(p.numel() for p in policy.parameters()) / 1e6,
        "critic_params_m": sum(p.numel() for p in module.critic_parameters()) / 1e6 if leg != "grpo" else 0.0,
        "separate_critic": critic is not None,
    }


def _status_gb(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS: now; VmHWM: peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux >= 4.0), so that model loading does not count as the peak."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _time(module, obj, attr: str, section: str) -> None:
    fn = getattr(obj, attr)

    def timed(*args, **kwargs):
        started = clock(module.device)
        try:
            return fn(*args, **kwargs)
        finally:
            module.section_times[section] = module.section_times.get(section, 0.0) + clock(module.device) - started

    setattr(obj, attr, timed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--legs", nargs="+", choices=LEGS, default=list(LEGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="steps per leg and round, the first one a warm-up")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--leg", choices=LEGS, help=argparse.SUPPRESS)  # child process: run one leg, print JSON
    args = parser.parse_args(argv)
    if args.leg:
        print("BENCH " + json.dumps(run_leg(args.leg, args.steps, args.seed, args.threads)), flush=True)
        return 0
    results: dict[str, list[dict]] = {leg: [] for leg in args.legs}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    for round_index in range(args.rounds):
        for leg in args.legs:
            command = [
                sys.executable,
                __file__,
                "--leg",
                leg,
                "--steps",
                str(args.steps),
                "--seed",
                str(args.seed),
                "--threads",
                str(args.threads),
            ]
            out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
            line = next((text for text in out.stdout.splitlines() if text.startswith("BENCH ")), None)
            if out.returncode or line is None:
                raise SystemExit(f"leg {leg} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            result = json.loads(line[len("BENCH ") :])
            results[leg].append(result)
            timed = result["steps"][1:] or result["steps"]
            print(
                f"round {round_index + 1} {leg}: median step {statistics.median(s['step_s'] for s in timed):.2f} s, "
                f"RSS at start {result['start_rss_gb']:.2f} GB, peak {result['peak_rss_gb']:.2f} GB",
                flush=True,
            )
    print(
        f"\nSmolLM2-135M-Instruct, {len(PROMPTS)} prompts x {GENERATIONS} x {NEW_TOKENS} tokens, fp32, "
        f"{args.threads} thread(s); medians over {args.rounds} round(s) x {args.steps - 1} timed step(s)"
    )
    print(
        f"{'leg':<14}{'step s':>8}{'cpu s':>8}{'gen s':>8}{'adv s':>8}{'update s':>9}"
        f"{'RSS start GB':>14}{'RSS peak GB':>13}{'params M':>10}{'vs grpo':>9}"
    )
    base = None
    for leg, runs in results.items():
        timed = [s for r in runs for s in (r["steps"][1:] or r["steps"])]
        med = {k: statistics.median(s[k] for s in timed) for k in ("step_s", "cpu_s", *SECTIONS)}
        rss = max(r["peak_rss_gb"] for r in runs)
        start = max(r["start_rss_gb"] for r in runs)
        params = runs[0]["policy_params_m"] + (runs[0]["critic_params_m"] if runs[0]["separate_critic"] else 0.0)
        base = base or (med["step_s"] if leg == "grpo" else None)
        ratio = f"{med['step_s'] / base:.2f}x" if base else "-"
        print(
            f"{leg:<14}{med['step_s']:>8.2f}{med['cpu_s']:>8.2f}{med['generation_s']:>8.2f}{med['advantages_s']:>8.2f}"
            f"{med['update_s']:>9.2f}{start:>14.2f}{rss:>13.2f}{params:>10.1f}{ratio:>9}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
