"""Best-of-n difficulty filter: train on the prompts the current policy finds neither trivial nor hopeless.

As in Kimi k1.5 and Qwen3: before training and then every `refresh_every_n_epochs` epochs,
`RLVRDataModule` draws up to `max_candidates` candidate prompts, samples `n` responses to each
with the current policy (the run's sampling settings), scores them with the run's reward
callbacks, and keeps prompts by pass rate:

    window    keep  low < pass_rate < high     (default (0, 1): neither always right nor always wrong)
    fail_all  keep  pass_rate == 0             (prompts the policy fails all n times)

A response passes when its total reward reaches `pass_threshold`, or, with `pass_reward`, when
that named reward reaches its maximum (`pass_reward_max`, else the callback's `max_score`
attribute); with neither, when the run's first "task" reward says it is correct (`is_correct`,
exact sort on the sort task). Under DDP the candidates are split across ranks and the pass
counts gathered, so every rank keeps the same prompts.

The filter holds the curriculum state (kept prompts, pass counts, refresh counters) that
`RLVRDataModule.state_dict` puts in checkpoints.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Annotated, Any

import torch
from torch import Tensor

from rlvr_lightning.data.task import Example, collate_examples
from rlvr_lightning.parallel.fsdp import gathered_params
from rlvr_lightning.runtime.distributed import all_gather
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import POSITIVE_INT, PROBABILITY, Range

log = logging.getLogger(__name__)

MODES = ("window", "fail_all")
TOO_FEW_CHOICES = ("fallback", "error")


@documented_options
class DifficultyFilter:
    def __init__(
        self,
        n: Annotated[
            int, Option("responses sampled per candidate prompt to estimate its pass rate.", POSITIVE_INT)
        ] = 8,
        mode: str = "window",
        low: Annotated[float, Option("the window's lower bound (exclusive).", PROBABILITY)] = 0.0,
        high: Annotated[float, Option("the window's upper bound (exclusive).", PROBABILITY)] = 1.0,
        pass_threshold: Annotated[
            float | None, Option("a response passes when its weighted total reward is >= this.", Range(optional=True))
        ] = None,
        pass_reward: str | None = None,
        pass_reward_max: Annotated[
            float | None,
            Option(
                "the pass mark of `pass_reward` (default: the callback's `max_score` attribute).", Range(optional=True)
            ),
        ] = None,
        batch_size: Annotated[int, Option("prompts per sampling call of the estimation.", POSITIVE_INT)] = 64,
        max_candidates: Annotated[
            int | None,
            Option(
                "candidate prompts scored per refresh (None: the whole pool of a finite task).",
                Range(1, integer=True, optional=True),
            ),
        ] = 1024,
        refresh_every_n_epochs: Annotated[
            int, Option("re-estimate every this many epochs (Lightning reloads the train dataloader).", POSITIVE_INT)
        ] = 1,
        min_kept: Annotated[
            int | None,
            Option(
                "fewest kept prompts to train on; default one global batch (batch_size x world size).",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        too_few: str = "fallback",
    ) -> None:
        """
        Args:
            mode: "window" (keep low < pass rate < high) or "fail_all" (keep prompts failed n times out of n).
            pass_reward: a response passes when reward `pass_reward` (a reward callback's name) is >=
                `pass_reward_max`.
            too_few: when fewer survive, "fallback" (train on the unfiltered pool until the next refresh, and
                warn) or "error".
        """
        check_options(DifficultyFilter, locals(), prefix="difficulty_filter.")
        if mode not in MODES:
            raise ValueError(f"difficulty_filter.mode={mode!r} is not valid; choose one of {list(MODES)}")
        if too_few not in TOO_FEW_CHOICES:
            raise ValueError(
                f"difficulty_filter.too_few={too_few!r} is not valid; choose one of {list(TOO_FEW_CHOICES)}"
            )
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"difficulty_filter needs 0 <= low < high <= 1, got low={low}, high={high}")
        if pass_threshold is not None and pass_reward is not None:
            raise ValueError("set difficulty_filter.pass_threshold or pass_reward, not both")
        if pass_reward_max is not None and pass_reward is None:
            raise ValueError("difficulty_filter.pass_reward_max needs pass_reward (the reward it is the maximum of)")
        self.n = n
        self.mode = mode
        self.low = low
        self.high = high
        self.pass_threshold = pass_threshold
        self.pass_reward = pass_reward
        self.pass_reward_max = pass_reward_max
        self.batch_size = batch_size
        self.max_candidates = max_candidates
        self.refresh_every_n_epochs = refresh_every_n_epochs
        self.min_kept = min_kept
        self.too_few = too_few
        # curriculum state (checkpointed by RLVRDataModule)
        self.refresh_index = 0  # refreshes done
        self.refresh_epoch: int | None = None  # epoch of the last refresh
        self.kept: list[Example] | None = None  # None: training on the unfiltered pool (fallback)
        self.candidates: list[Example] = []
        self.pass_counts: list[int] = []  # passes out of n, per candidate of the last refresh
        self.last_stats: dict[str, float] = {}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {
            "refresh_index": self.refresh_index,
            "refresh_epoch": self.refresh_epoch,
            "kept": self.kept,
            "candidates": self.candidates,
            "pass_counts": self.pass_counts,
            "last_stats": self.last_stats,
            "n": self.n,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("n", self.n) != self.n:
            log.warning(
                "difficulty filter: checkpoint estimated pass rates with n=%s, this run uses n=%s", state["n"], self.n
            )
        self.refresh_index = int(state["refresh_index"])
        self.refresh_epoch = state["refresh_epoch"]
        self.kept = state["kept"]
        self.candidates = state.get("candidates", [])
        self.pass_counts = list(state["pass_counts"])
        self.last_stats = dict(state.get("last_stats", {}))

    def refresh_due(self, epoch: int) -> bool:
        return self.refresh_epoch is None or epoch - self.refresh_epoch >= self.refresh_every_n_epochs

    # ------------------------------------------------------------- estimation

    def passes(self, module, rollout) -> Tensor:
        """`bool[N]`: which responses of a scored rollout pass."""
        if self.pass_threshold is not None:
            return rollout.reward >= self.pass_threshold
        if self.pass_reward is not None:
            callbacks = {cb.name: cb for cb in module.reward_callbacks}
            if self.pass_reward not in callbacks:
                raise ValueError(
                    f"difficulty_filter.pass_reward={self.pass_reward!r} is not one of the run's rewards "
                    f"{sorted(callbacks)}"
                )
            maximum = self.pass_reward_max
            if maximum is None:
                maximum = getattr(callbacks[self.pass_reward], "max_score", None)
                if callable(maximum):
                    maximum = maximum(rollout)
            if maximum is None:
                raise ValueError(
                    f"reward {self.pass_reward!r} does not declare its maximum (`max_score`): "
                    "set difficulty_filter.pass_reward_max"
                )
            return rollout.rewards[self.pass_reward] >= maximum
        correct = module.correctness(rollout)
        if correct is None:
            raise ValueError(
                "no reward of kind 'task' can tell a correct response (is_correct): "
                "set difficulty_filter.pass_threshold or pass_reward"
            )
        return correct

    def estimate(
        self, module, candidates: list[Example], seed: int, rank: int = 0, world_size: int = 1, trainer=None
    ) -> tuple[Tensor, float]:
        """Pass counts `long[C]` (out of `n`) of the candidates, and this rank's seconds.

        Rank r scores the r-th contiguous share of the candidates; the counts are all-gathered, so
        every rank returns the same tensor. Sampling runs under a forked RNG seeded by (seed, rank):
        it neither depends on nor disturbs the training RNG streams (exact resume).
        """
        started = time.perf_counter()
        share = math.ceil(len(candidates) / world_size) if candidates else 0
        mine = candidates[rank * share : (rank + 1) * share]
        device = module.device
        counts = torch.full((share,), -1, dtype=torch.long, device=device)
        fork_devices = [device.index or 0] if device.type == "cuda" else []
        # a sharded (FSDP2) policy is gathered once for the whole estimation
        with torch.random.fork_rng(devices=fork_devices), torch.no_grad(), gathered_params(module.policy):
            torch.manual_seed(seed)
            for start in range(0, len(mine), self.batch_size):
                chunk = mine[start : start + self.batch_size]
                rollout = module.policy.sample(collate_examples(chunk), self.n, module.sampling)
                module.score(rollout)
                passed = self.passes(module, rollout).reshape(len(chunk), self.n).sum(dim=1)
                counts[start : start + len(chunk)] = passed.to(device=device, dtype=torch.long)
        seconds = time.perf_counter() - started
        if world_size > 1:
            counts = all_gather(trainer, counts).reshape(-1)
        counts = counts[: len(candidates)].cpu()
        if bool((counts < 0).any()):
            raise RuntimeError("difficulty filter: some candidates were not scored (rank shares out of step)")
        return counts, seconds

    def select(self, pass_counts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Masks `bool[C]`: kept, dropped as too easy, dropped as too hard."""
        if self.mode == "fail_all":
            keep = pass_counts == 0
            return keep, ~keep, torch.zeros_like(keep)
        rate = pass_counts.double() / self.n
        too_hard = rate <= self.low
        too_easy = rate >= self.high
        return ~(too_hard | too_easy), too_easy, too_hard

    def refresh(
        self,
        module,
        candidates: list[Example],
        epoch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        trainer=None,
        min_kept: int = 1,
    ) -> dict[str, float]:
        """Estimate, select and update the curriculum state; returns the stats to log."""
        counts, seconds = self.estimate(
            module,
            candidates,
            seed=seed * 1_000_003 + self.refresh_index * 7_919 + rank,
            rank=rank,
            world_size=world_size,
            trainer=trainer,
        )
        keep, too_easy, too_hard = self.select(counts)
        kept = [candidates[i] for i in keep.nonzero().flatten().tolist()]
        fallback = len(kept) < min_kept
        if fallback and self.too_few == "error":
            raise RuntimeError(
                f"difficulty filter kept {len(kept)} of {len(candidates)} prompts, fewer than one batch ({min_kept}); "
                "widen the window, raise max_candidates, or set difficulty_filter.too_few=fallback"
            )
        self.refresh_index += 1
        self.refresh_epoch = epoch
        self.candidates = list(candidates)
        self.pass_counts = counts.tolist()
        self.kept = None if fallback else kept
        histogram = torch.bincount(counts, minlength=self.n + 1)
        stats = {
            "curriculum/refresh": float(self.refresh_index),
            "curriculum/candidates": float(len(candidates)),
            "curriculum/kept": float(len(kept)),
            "curriculum/kept_fraction": len(kept) / max(len(candidates), 1),
            "curriculum/too_easy": float(too_easy.sum()),
            "curriculum/too_hard": float(too_hard.sum()),
            "curriculum/pass_rate_mean": float(counts.double().mean() / self.n) if len(candidates) else 0.0,
            "curriculum/fallback": float(fallback),
            "curriculum/completions": float(len(candidates) * self.n),
            "curriculum/estimation_s": seconds,  # this rank's; RLVRDataModule logs the max over ranks
        }
        for k, count in enumerate(histogram.tolist()):
            stats[f"curriculum/passes_{k}_of_{self.n}"] = float(count)
        self.last_stats = stats
        return stats
