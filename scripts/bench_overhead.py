"""What does the framework cost over a plain PyTorch loop? (issue: core, acceptance "bench_overhead")

Runs the CS336 lecture-17 sort algorithm (configs/sort_lecture.yaml) twice per round, once as
the plain loop below and once as `rlvr fit` with that exact config (W&B offline + CSV logging,
Rich progress bar, validation), same seed and number of steps, threads pinned. A step's time
is measured from one training batch's end to the next, so it includes everything Lightning
does between steps. Two clocks: wall time, and the CPU time of the training thread
(`time.thread_time`, with torch pinned to that one thread), which other processes on a
shared machine cannot inflate. Prints the median step time of each run, and the ratio of the
medians over `--rounds` rounds.

    python scripts/bench_overhead.py --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from rlvr_lightning.cli import main as rlvr_cli
from rlvr_lightning.policies.toy_sort import ToySortPolicy

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "sort_lecture.yaml"
V, L, PROMPTS, G, EPOCHS, LR, EPS, BETA, REF_EVERY = 10, 4, 128, 8, 4, 2e-2, 0.2, 0.02, 30


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


class LectureStep:
    """One step of the lecture algorithm in plain PyTorch: no Lightning, no callbacks, no logging."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.policy = ToySortPolicy(vocab_size=V, prompt_length=L, embedding_dim=10)
        self.reference = copy.deepcopy(self.policy).requires_grad_(False)

    def __call__(self, step: int, prompts: torch.Tensor, optimizer: torch.optim.Optimizer, backward=None) -> float:
        policy, reference = self.policy, self.reference
        if step > 0 and step % REF_EVERY == 0:
            reference.load_state_dict(policy.state_dict())
        with torch.no_grad():
            probs = policy(prompts).softmax(-1).reshape(-1, V)
            responses = torch.multinomial(probs, G, replacement=True).view(PROMPTS, L, G).transpose(1, 2)
        inclusion = (prompts[:, None, :, None] == responses[:, :, None, :]).any(-1).sum(-1)
        ordering = (responses[..., 1:] >= responses[..., :-1]).sum(-1)
        reward = (inclusion + ordering).float()  # [B, G]
        advantage = (reward - reward.mean(1, keepdim=True))[..., None]  # centred, [B, G, 1]

        def log_probs(model):
            lp = model(prompts).log_softmax(-1)[:, None].expand(-1, G, -1, -1)
            return lp.gather(-1, responses[..., None]).squeeze(-1)  # [B, G, L]

        with torch.no_grad():
            old, ref = log_probs(policy), log_probs(reference)
        for _ in range(EPOCHS):
            lp = log_probs(policy)
            ratio = torch.exp(lp - old)
            pg = -torch.minimum(ratio * advantage, ratio.clamp(1 - EPS, 1 + EPS) * advantage)
            kl = torch.exp(ref - lp) - (ref - lp) - 1
            loss = (pg + BETA * kl).mean()
            optimizer.zero_grad()
            (backward or torch.Tensor.backward)(loss)
            optimizer.step()
        return reward.mean().item()


def plain_loop(steps: int, seed: int = 0) -> list[tuple[float, float]]:
    """The lecture algorithm as a plain PyTorch loop."""
    lecture = LectureStep(seed)
    optimizer = torch.optim.Adam(lecture.policy.parameters(), lr=LR)
    step_times, rewards = [], []
    for step in range(steps):
        started = clocks()
        prompts = torch.randint(0, V, (PROMPTS, L))
        rewards.append(lecture(step, prompts, optimizer))
        now = clocks()
        step_times.append((now[0] - started[0], now[1] - started[1]))
    print(f"  plain loop: step-{steps} reward {rewards[-1]:.3f}")
    return step_times


class BareLightningModule(pl.LightningModule):
    """The same loop body as a minimal LightningModule: manual optimisation, nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.lecture = LectureStep()
        self.policy = self.lecture.policy
        self.last_reward = 0.0

    def configure_optimizers(self):
        return torch.optim.Adam(self.policy.parameters(), lr=LR)

    def training_step(self, prompts: torch.Tensor, batch_idx: int) -> None:
        self.last_reward = self.lecture(batch_idx, prompts, self.optimizers(), backward=self.manual_backward)


class RandomPrompts(torch.utils.data.IterableDataset):
    def __iter__(self):
        while True:
            yield torch.randint(0, V, (PROMPTS, L))


def bare_lightning(steps: int, seed: int = 0) -> list[tuple[float, float]]:
    """Lightning's own floor: the plain loop's body in a bare `Trainer` (no loggers, bar, checkpoints)."""
    pl.seed_everything(seed, verbose=False)
    module = BareLightningModule()
    timer = StepTimer()
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer], accelerator="cpu", devices=1,
    )
    trainer.fit(module, torch.utils.data.DataLoader(RandomPrompts(), batch_size=None))
    print(f"  bare Lightning: step-{steps} reward {module.last_reward:.3f}")
    return timer.step_times


class StepTimer(pl.Callback):
    def __init__(self) -> None:
        self.step_times: list[tuple[float, float]] = []
        self.last = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = clocks()
        if self.last is not None:
            self.step_times.append((now[0] - self.last[0], now[1] - self.last[1]))
        self.last = now

    def on_validation_start(self, trainer, pl_module) -> None:
        self.last = None  # validation is not a training step


def framework(steps: int, seed: int = 0) -> list[tuple[float, float]]:
    with tempfile.TemporaryDirectory() as run_dir:
        cwd = os.getcwd()
        os.chdir(run_dir)
        try:
            cli = rlvr_cli(
                ["--config", str(CONFIG), f"--seed_everything={seed}", f"--trainer.limit_train_batches={steps}"],
                run=False,
            )
            timer = StepTimer()
            cli.trainer.callbacks.append(timer)
            cli.trainer.fit(cli.model, cli.datamodule)
            reward = float(cli.trainer.callback_metrics["train/reward_mean"])
        finally:
            os.chdir(cwd)
    print(f"  rlvr fit:   step-{steps} reward {reward:.3f}")
    return timer.step_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    legs = {"plain": plain_loop, "bare Lightning": bare_lightning, "rlvr fit": framework}
    medians: dict[str, list[tuple[float, float]]] = {name: [] for name in legs}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}")
        for name, run in legs.items():
            times = run(args.steps)
            medians[name].append((statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)))
        print("  median step (wall / cpu): " + ", ".join(f"{n} {m[-1][0] * 1e3:.2f} / {m[-1][1] * 1e3:.2f} ms" for n, m in medians.items()))
    print(f"\nthreads={args.threads} steps={args.steps} rounds={args.rounds}")
    for clock, index in (("wall", 0), ("cpu", 1)):
        plain, bare, fw = (statistics.median(m[index] for m in medians[name]) for name in legs)
        print(f"{clock:4s} median step: plain loop {plain * 1e3:.2f} ms, bare Lightning {bare * 1e3:.2f} ms, "
              f"rlvr fit {fw * 1e3:.2f} ms; bare Lightning / plain = {bare / plain:.3f}, "
              f"framework / plain = {fw / plain:.3f} (overhead {100 * (fw / plain - 1):+.1f}%)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
