"""`ValueTrackerAdvantage`: SPO's single-stream advantage, each response's reward minus its prompt's tracked
success probability, normalised over the whole batch (`core.value_tracker`).

Each prompt (known by a digest of its tokens) keeps ``alpha, beta``. A prompt met for the first time is sampled
``prior_samples`` times by the policy before the step samples it (as SPO's offline estimate, made when the run
first meets the prompt; ``0``: ``alpha = beta = 1/2``). After the step's update the tracker forgets at ``rho``
and counts the step's rewards: with ``rho: null`` (KL-adaptive, the paper's), ``rho`` comes from how far the
updated policy has moved on the prompt's previous response since the update after it was sampled, so the tracker
keeps each prompt's last response and its log-probs; ``rho: x`` forgets at a fixed rate. Rewards are mapped to
[0, 1] from [``reward_low``, ``reward_high``]. A group of ``G`` responses counts as ``G`` observations (the paper
samples one).

With ``prioritize: k`` (SPO's prioritized sampling) the step trains on ``k`` of each batch's prompts, drawn without
replacement with probability proportional to ``sqrt(p (1 - p)) + explore``; the data module's ``batch_size`` is then
the number drawn from, and new prompts are started (``prior_samples``) before the draw, so that every candidate is
weighed by its own estimate. A prompt whose tracker is unknown weighs as ``p = 1/2``.

Trackers, the last responses and the prompts already sampled live in the callback and in checkpoints. Under data
parallelism every rank gathers the step's prompts, rewards and last responses from every rank and applies them in
the same order, so every rank holds the same state and the batch normalisation is over the global batch.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from rlvr_lightning.advantages.callbacks import AdvantageCallback
from rlvr_lightning.advantages.prompt_state import data_prompt_digest, gathered, in_waves, prompt_digests, rank
from rlvr_lightning.core import value_tracker as tracker
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, POSITIVE, PROBABILITY, Range

RHO = Range(0, 1, low_open=True, optional=True)


def _records(rollout: Rollout, log_probs: Tensor) -> list[dict[str, Tensor | None]]:
    """What the tracker keeps of each row's response: its padded rows, copied to the CPU (a copy each, so that a kept
    row does not hold its whole step's tensors)."""
    rollout, log_probs = rollout.to("cpu"), log_probs.detach().float().cpu()
    names = ("prompt", "prompt_mask", "response", "mask", "log_probs")
    tensors = (rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_mask, log_probs)
    sources = [None] * rollout.num_rows if rollout.response_source is None else rollout.response_source.unbind(0)
    return [
        {
            **{name: row.clone() for name, row in zip(names, rows, strict=True)},
            "source": None if s is None else s.clone(),
        }
        for rows, s in zip(zip(*(t.unbind(0) for t in tensors), strict=True), sources, strict=True)
    ]


def _as_rollout(records: list[dict]) -> tuple[Rollout, Tensor]:
    """The records as one rollout (prompts left-padded, responses right-padded) and their log-probs `[n, T]`."""

    def right(name: str) -> Tensor:
        return pad_sequence([r[name] for r in records], batch_first=True)

    def left(name: str) -> Tensor:
        return pad_sequence([r[name].flip(0) for r in records], batch_first=True).flip(1)

    rollout = Rollout(
        prompt_ids=left("prompt"),
        prompt_mask=left("prompt_mask"),
        response_ids=right("response"),
        response_mask=right("mask"),
        group_index=torch.arange(len(records)),
        group_size=1,
        truncated=torch.zeros(len(records), dtype=torch.bool),
        response_source=None if any(r["source"] is None for r in records) else right("source"),
    )
    return rollout, right("log_probs")


@torch.no_grad()
def _policy_log_probs(pl_module, rollout: Rollout) -> Tensor:
    update = pl_module.policy_update
    rollout = rollout.to(pl_module.device)
    return update.by_micro_batch(rollout, lambda mb: pl_module.policy.token_log_probs(mb, update.temperature)[0])


@documented_options
class ValueTrackerAdvantage(AdvantageCallback):
    """SPO's advantage (Xu and Ding 2025, arXiv:2509.13232): ``r - p(x)``, ``p(x)`` a per-prompt Beta tracker of the
    success probability kept across the run and discounted as the policy drifts, normalised over the batch. No group
    is needed (``group_size: 1``, the paper's) and no group is ever degenerate. See the module docstring."""

    def __init__(
        self,
        prior_samples: Annotated[
            int,
            Option(
                "responses sampled to start a new prompt's tracker (SPO's offline estimate: 8; 0: 1/2).",
                NON_NEGATIVE_INT,
            ),
        ] = 8,
        rho: Annotated[
            float | None, Option("a fixed forgetting rate; null: from the policy's drift (KL-adaptive).", RHO)
        ] = None,
        rho_min: Annotated[float, Option("the KL-adaptive rate's lower bound (0.875).", PROBABILITY)] = 0.875,
        rho_max: Annotated[float, Option("the KL-adaptive rate's upper bound (0.96).", PROBABILITY)] = 0.96,
        d_half: Annotated[float, Option("the drift D that halves a tracker's weight (0.06).", POSITIVE)] = 0.06,
        reward_low: Annotated[float, Option("the reward mapped to 0 (rewards are clipped to the range).")] = 0.0,
        reward_high: Annotated[float, Option("the reward mapped to 1.")] = 1.0,
        eps: Annotated[float, Option("added to the batch's std.", POSITIVE)] = 1e-8,
        prioritize: Annotated[
            int | None,
            Option(
                "train on this many of each batch's prompts (per rank), drawn by sqrt(p (1 - p)) + explore "
                "(SPO's prioritized sampling; data.batch_size is the number drawn from); null: every prompt.",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        explore: Annotated[
            float, Option("the weight each prompt has beyond sqrt(p (1 - p)) in prioritized sampling (0.05).", POSITIVE)
        ] = 0.05,
    ) -> None:
        check_options(ValueTrackerAdvantage, locals())
        if rho_min > rho_max:
            raise ValueError(f"ValueTrackerAdvantage: rho_min={rho_min} must be <= rho_max={rho_max}")
        if reward_high <= reward_low:
            raise ValueError(f"ValueTrackerAdvantage: reward_high={reward_high} must be > reward_low={reward_low}")
        self.prior_samples, self.rho, self.d_half = prior_samples, rho, d_half
        self.rho_min, self.rho_max = rho_min, rho_max
        self.reward_low, self.reward_high, self.eps = reward_low, reward_high, eps
        self.prioritize, self.explore = prioritize, explore
        self.reads_step_batch = None
        if prioritize:
            self.reads_step_batch = "draws the step's prompts from the batch by their trackers"
        if prior_samples:
            self.reads_step_batch = "samples the policy on each prompt met for the first time"
        self.trackers: dict[str, tuple[float, float, int]] = {}  # prompt digest -> (alpha, beta, steps trained)
        self.last: dict[str, dict] = {}  # prompt digest -> its last response and log-probs (KL-adaptive rho)
        self.primed: set[str] = set()  # digests of the raw prompts whose prior was sampled
        self.keys: dict[str, str] = {}  # raw prompt digest -> its tracker's key (prioritized sampling)
        self._step_raws: list[str] | None = None  # the digests of the prompts the step trains on
        self._drawn: dict[str, float] = {}
        self._pending: tuple[Rollout, list[str], Tensor] | None = None
        self._metrics: dict[str, float] = {}
        self._rho_mean: float | None = None

    def unit_rewards(self, rewards: Tensor) -> Tensor:
        return ((rewards - self.reward_low) / (self.reward_high - self.reward_low)).clamp(0.0, 1.0)

    def on_train_batch_start(self, trainer, pl_module, batch: dict[str, list], batch_idx: int) -> None:
        """Start the trackers of the batch's prompts met for the first time from `prior_samples` responses each; with
        `prioritize`, then keep that many of the batch's prompts (in place), drawn by their trackers."""
        if not (self.prior_samples or self.prioritize):
            return
        raws = [data_prompt_digest(prompt) for prompt in batch["prompt"]]
        if self.prioritize is not None and len(raws) <= self.prioritize:
            raise ValueError(
                f"ValueTrackerAdvantage: prioritize={self.prioritize} draws from each batch's prompts, and this batch "
                f"holds {len(raws)}: set data.batch_size above {self.prioritize} (SPO draws 1,024 from far more)"
            )
        if self.prior_samples:
            self._start_trackers(pl_module, batch, raws)
        if self.prioritize is not None:
            raws = self._draw(batch, raws)
        self._step_raws = raws

    def _draw(self, batch: dict[str, list], raws: list[str]) -> list[str]:
        """Keep `prioritize` of the batch's prompts (SPO's prioritized sampling); the kept prompts' digests."""
        values = torch.tensor([self.value(self.keys.get(raw, "")) for raw in raws], dtype=torch.float64)
        weights = tracker.sampling_weights(values, self.explore)
        kept = tracker.prioritized_draw(weights, self.prioritize).tolist()
        for name, column in batch.items():
            batch[name] = [column[i] for i in kept]
        spread = weights - self.explore
        self._drawn = {
            "train/spo/drawn_std_mean": float(spread[kept].mean()),
            "train/spo/candidate_std_mean": float(spread.mean()),
        }
        return [raws[i] for i in kept]

    def _start_trackers(self, pl_module, batch: dict[str, list], raws: list[str]) -> None:
        new = list(dict.fromkeys(raw for raw in raws if raw not in self.primed))
        found: list[tuple[str, float, float]] = []
        if new:
            first = {raw: raws.index(raw) for raw in new}
            unseen = {name: [values[first[raw]] for raw in new] for name, values in batch.items()}
            sampled = pl_module.policy.sample(unseen, self.prior_samples, pl_module.sampling)
            pl_module.score(sampled)
            successes = self.unit_rewards(sampled.reward.detach().double().cpu()).view(len(new), -1).sum(-1)
            alpha, beta = tracker.initial_tracker(successes, self.prior_samples, self.rho_min)
            found = list(zip(prompt_digests(sampled), alpha.tolist(), beta.tolist(), strict=True))
        for raw_new, part in gathered((new, found)):
            self.primed.update(raw_new)
            for raw, (key, alpha, beta) in zip(raw_new, part, strict=True):
                self.trackers.setdefault(key, (alpha, beta, 0))
                if self.prioritize is not None:
                    self.keys[raw] = key

    def value(self, key: str) -> float:
        alpha, beta, _ = self.trackers.get(key, (0.5, 0.5, 0))
        return alpha / (alpha + beta)

    def compute(self, rollout: Rollout) -> Tensor:
        digests, size = prompt_digests(rollout), rollout.group_size
        rewards = self.unit_rewards(rollout.reward.detach().double().cpu())
        raws = self._step_raws if self.prioritize is not None else None
        if raws is not None and len(raws) != len(digests):
            raise ValueError(
                f"ValueTrackerAdvantage: the step's rollout holds {len(digests)} prompts, not the {len(raws)} drawn "
                "from the batch (prioritize needs the step's own prompts)"
            )
        parts = gathered((digests, rewards, raws))
        start = sum(len(keys) for keys, _, _ in parts[: rank()]) * size
        keys = [key for part, _, _ in parts for key in part]
        for part_keys, _, part_raws in parts:
            if part_raws is not None:
                self.keys.update(zip(part_raws, part_keys, strict=True))
        values = torch.tensor([self.value(key) for key in keys], dtype=torch.float64).repeat_interleave(size)
        advantages = tracker.single_stream_advantages(torch.cat([r for _, r, _ in parts]), values, self.eps)
        self._pending = (rollout, digests, rewards)
        self._metrics = {"train/spo/value_mean": float(values.mean())}
        first = sum(self.trackers.get(key, (0, 0, 0))[2] == 0 for key in keys)
        self._metrics["train/spo/first_visit_frac"] = first / len(keys)
        if self._rho_mean is not None:
            self._metrics["train/spo/rho_mean"] = self._rho_mean
        own = advantages[start : start + rollout.num_rows]
        return own.to(device=rollout.reward.device, dtype=rollout.reward.dtype)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """After the update: each trained prompt's tracker forgets and counts the step's rewards."""
        if self._pending is None:
            return
        rollout, digests, rewards = self._pending
        self._pending = None
        size = rollout.group_size
        sums = rewards.view(-1, size).sum(-1)
        records: list[dict | None] = [None] * len(digests)
        if self.rho is None:
            firsts = rollout.select(torch.arange(0, rollout.num_rows, size))
            now = _policy_log_probs(pl_module, firsts)
            records = _records(firsts, now)
            drift = torch.zeros(len(digests), dtype=torch.float64)
            known = [row for row, key in enumerate(digests) if key in self.last]
            if known:
                previous, then = _as_rollout([self.last[digests[row]] for row in known])
                now_on_previous = _policy_log_probs(pl_module, previous).float().cpu()
                drift[known] = tracker.mean_abs_log_ratio(then, now_on_previous, previous.response_mask).double()
            rhos = tracker.forgetting_rate(drift, self.d_half, self.rho_min, self.rho_max)
        else:
            rhos = torch.full((len(digests),), self.rho, dtype=torch.float64)
        keys, totals, rates, kept = [], [], [], []
        for part_keys, part_totals, part_rhos, part_records in gathered((digests, sums, rhos, records)):
            keys += part_keys
            totals.append(part_totals)
            rates.append(part_rhos)
            kept += part_records
        self._update(keys, torch.cat(totals), torch.cat(rates), size)
        self.last.update((key, record) for key, record in zip(keys, kept, strict=True) if record is not None)
        self._rho_mean = float(torch.cat(rates).mean())

    def _update(self, keys: list[str], totals: Tensor, rates: Tensor, size: int) -> None:
        """Each prompt's tracker forgets and counts its responses; a prompt twice in a step is updated twice, in
        order (in waves, each a set of distinct prompts)."""
        for wave in in_waves(keys):
            known = torch.tensor([self.trackers.get(keys[i], (0.5, 0.5, 0)) for i in wave], dtype=torch.float64)
            alpha, beta = tracker.tracked(known[:, 0], known[:, 1], rates[wave], totals[wave], size)
            visits = known[:, 2].long() + 1
            columns = (alpha.tolist(), beta.tolist(), visits.tolist())
            self.trackers.update(zip((keys[i] for i in wave), zip(*columns, strict=True), strict=True))

    def step_metrics(self) -> dict[str, float]:
        return {**self._metrics, **self._drawn}

    def state_dict(self) -> dict[str, Any]:
        state = {"trackers": dict(self.trackers), "last": _packed(self.last), "primed": sorted(self.primed)}
        return {**state, "keys": dict(self.keys)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.trackers = {key: tuple(value) for key, value in state_dict["trackers"].items()}
        self.last = _unpacked(state_dict["last"])
        self.primed = set(state_dict["primed"])
        self.keys = dict(state_dict.get("keys", {}))


RECORD_FIELDS = ("prompt", "prompt_mask", "response", "mask", "log_probs", "source")


def _packed(last: dict[str, dict]) -> dict[str, Any]:
    """The kept responses as a few flat tensors (a checkpoint of thousands of small tensors saves slowly)."""
    keys = list(last)
    packed: dict[str, Any] = {"keys": keys}
    for name in RECORD_FIELDS:
        rows = [last[key][name] for key in keys]
        if rows and all(row is not None for row in rows):
            packed[name] = (torch.cat(rows), torch.tensor([len(row) for row in rows]))
    return packed


def _unpacked(packed: dict[str, Any]) -> dict[str, dict]:
    keys = packed["keys"]
    columns = {
        name: packed[name][0].split(packed[name][1].tolist()) if name in packed else [None] * len(keys)
        for name in RECORD_FIELDS
    }
    return {key: {name: columns[name][i] for name in RECORD_FIELDS} for i, key in enumerate(keys)}
