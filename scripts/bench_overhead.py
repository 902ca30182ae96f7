"""What does the framework cost over a plain PyTorch loop?

Runs the CS336 lecture-17 sort algorithm (configs/sort_lecture.yaml) as `rlvr fit` with that exact
config (W&B offline + CSV logging, Rich progress bar, validation), as `rlvr fit` without loggers
and progress bar (what the module itself costs), and, as Lightning's own floor, as the plain
loop's body in a bare `Trainer`. Threads are pinned.

The plain loop is measured side by side with each run, in alternating blocks: after every 10
training batches a callback runs 10 steps of the plain loop (its own model, optimizer and random
stream, same seed and step count), each timed on its own, so a busy spell on a shared machine
slows both alike. The run's step is timed from one training batch's end to the next (minus a plain
block in between), so it includes everything Lightning does between steps. Two clocks: wall time, and
the CPU time of the training thread (`time.thread_time`). Prints the median step times and their
ratio per round, and the median of the per-round ratios.

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

from rlvr_lightning.cli.app import main as rlvr_cli
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


class PairedPlainLoop(pl.Callback):
    """Blocks of the plain loop between blocks of the run it is added to: after every `block` training
    batches, `block` steps of the plain loop, each timed on its own.

    `run_times` are the run's steps (batch end to batch end, minus the plain block in between);
    `plain_times` the plain loop's. Blocks rather than single steps, so that neither side pays for
    the other's cache misses on every step. The plain loop's random stream is its own: the run's
    numbers do not change."""

    def __init__(self, seed: int = 0, block: int = 10) -> None:
        with torch.random.fork_rng(devices=[]):
            self.lecture = LectureStep(seed)
            self.rng_state = torch.get_rng_state()
        self.optimizer = torch.optim.Adam(self.lecture.policy.parameters(), lr=LR)
        self.block = block
        self.run_times: list[tuple[float, float]] = []
        self.plain_times: list[tuple[float, float]] = []
        self.plain_reward = 0.0
        self.plain_steps = 0
        self.batches = 0
        self.last = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = clocks()
        if self.last is not None:
            self.run_times.append((now[0] - self.last[0], now[1] - self.last[1]))
        self.batches += 1
        if self.batches % self.block == 0:
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(self.rng_state)
                for _ in range(self.block):
                    self._plain_step()
                self.rng_state = torch.get_rng_state()
        self.last = clocks()

    def _plain_step(self) -> None:
        started = clocks()
        prompts = torch.randint(0, V, (PROMPTS, L))
        self.plain_reward = self.lecture(self.plain_steps, prompts, self.optimizer)
        finished = clocks()
        self.plain_times.append((finished[0] - started[0], finished[1] - started[1]))
        self.plain_steps += 1

    def on_validation_start(self, trainer, pl_module) -> None:
        self.last = None  # validation is not a training step


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


def bare_lightning(steps: int, seed: int = 0) -> PairedPlainLoop:
    """Lightning's own floor: the plain loop's body in a bare `Trainer` (no loggers, bar, checkpoints)."""
    pl.seed_everything(seed, verbose=False)
    module = BareLightningModule()
    paired = PairedPlainLoop(seed)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[paired],
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(module, torch.utils.data.DataLoader(RandomPrompts(), batch_size=None))
    print(
        f"  bare Lightning: step-{steps} reward {module.last_reward:.3f} (paired plain loop {paired.plain_reward:.3f})"
    )
    return paired


def framework(steps: int, seed: int = 0, extra_args: tuple[str, ...] = ()) -> PairedPlainLoop:
    with tempfile.TemporaryDirectory() as run_dir:
        cwd = os.getcwd()
        os.chdir(run_dir)
        try:
            cli = rlvr_cli(
                [
                    "--config",
                    str(CONFIG),
                    f"--seed_everything={seed}",
                    f"--trainer.limit_train_batches={steps}",
                    *extra_args,
                ],
                run=False,
            )
            paired = PairedPlainLoop(seed)
            cli.trainer.callbacks.append(paired)
            cli.trainer.fit(cli.model, cli.datamodule)
            reward = float(cli.trainer.callback_metrics["train/reward_mean"])
        finally:
            os.chdir(cwd)
    print(f"  rlvr fit:   step-{steps} reward {reward:.3f} (paired plain loop {paired.plain_reward:.3f})")
    return paired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet = ("--trainer.logger=false", "--trainer.enable_progress_bar=false")
    legs = {
        "bare Lightning": bare_lightning,
        "rlvr fit, no loggers or bar": lambda steps: framework(steps, extra_args=quiet),
        "rlvr fit": framework,
    }
    ratios: dict[str, list[tuple[float, float]]] = {name: [] for name in legs}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}")
        for name, run in legs.items():
            paired = run(args.steps)
            medians = [
                (
                    statistics.median(t[clock] for t in paired.run_times),
                    statistics.median(t[clock] for t in paired.plain_times),
                )
                for clock in (0, 1)
            ]
            ratios[name].append((medians[0][0] / medians[0][1], medians[1][0] / medians[1][1]))
            print(
                f"    median step wall {medians[0][0] * 1e3:.2f} ms vs plain {medians[0][1] * 1e3:.2f} ms "
                f"({ratios[name][-1][0]:.3f}x), "
                f"cpu {medians[1][0] * 1e3:.2f} ms vs plain {medians[1][1] * 1e3:.2f} ms ({ratios[name][-1][1]:.3f}x)"
            )
    print(
        f"\nthreads={args.threads} steps={args.steps} rounds={args.rounds}; "
        "per-step time / paired plain-loop step time, median of rounds:"
    )
    for name in legs:
        wall, cpu = (statistics.median(r[clock] for r in ratios[name]) for clock in (0, 1))
        print(f"  {name:28s} wall {wall:.3f}x ({100 * (wall - 1):+.1f}%), cpu {cpu:.3f}x ({100 * (cpu - 1):+.1f}%)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
