"""A replay buffer of informative groups (TRL's `GRPOWithReplayBufferTrainer`): a group whose rewards all agree
teaches nothing under a group baseline, so it is replaced by a group trained on before.

At every step, after advantages:

    1. each group whose rewards differ enters the buffer with the score sum_i |A_i| * std(r)  (its rows' mean
       absolute advantage, times its rewards' sample std); a full buffer keeps the `size` highest scores;
    2. each group whose rewards all agree is replaced by a group drawn from the buffer with probability
       proportional to its score (without replacement while the buffer has enough groups); with `max_age`, groups
       sampled more than that many rollout steps ago leave the buffer first (TRL keeps them until outscored).

A replayed group keeps what it was trained with: its advantages, reference log-probs and old log-probs, i.e. the
log-probs of the policy that sampled it, so the PPO ratio (and its clip) corrects for how far the policy has moved
since. The buffer and its random stream are checkpointed (resume is exact): each data-parallel rank keeps its own
buffer of its own groups, and the checkpoint holds every rank's (`ranks_state_dict`).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from typing import Any

import torch
from torch import Tensor

from rlvr_lightning.core.advantage_estimators import zero_variance_group_mask
from rlvr_lightning.core.masked import masked_mean
from rlvr_lightning.modules.options import ReplayConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)

#: per-token fields a step computes or not by its options; parts of one rollout must agree on them
OPTIONAL = ("old_log_probs", "ref_log_probs", "sampling_log_probs", "teacher_log_probs", "values", "token_energy")


def group_scores(rollout: Rollout) -> Tensor:
    """`[num_groups]`: sum over a group's rows of the mean absolute advantage over the row's tokens, times the
    group's reward std (unbiased; TRL `update_replay_buffer`: `(group_advantages.abs() * group_std_rewards).sum`)."""
    advantage = rollout.advantages.abs()  # [N] or, from a per-token estimator, [N, T]
    row_advantage = advantage if advantage.ndim == 1 else masked_mean(advantage, rollout.response_mask, dim=-1)
    grouped = row_advantage.view(-1, rollout.group_size)
    return grouped.sum(dim=1) * rollout.reward.view(-1, rollout.group_size).std(dim=1)


class GroupReplayBuffer:
    def __init__(self, size: int, seed: int = 0, max_age: int | None = None) -> None:
        self.size, self.max_age = size, max_age
        self.entries: list[tuple[float, int, int, Rollout]] = []  # a min-heap of (score, order, step, group)
        self.added = 0  # entries ever added: the tie-breaker, so that equal scores never compare rollouts
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, group: Rollout, score: float, step: int) -> None:
        entry = (score, self.added, step, group.to("cpu"))
        self.added += 1
        if len(self.entries) < self.size:
            heapq.heappush(self.entries, entry)
        elif score > self.entries[0][0]:  # better than the worst kept (TRL's `ReplayBuffer.add`)
            heapq.heapreplace(self.entries, entry)

    def draw(self, count: int) -> list[tuple[int, Rollout]]:
        """`count` groups (and the step each was sampled at), drawn in proportion to their scores."""
        scores = torch.tensor([entry[0] for entry in self.entries], dtype=torch.float64)
        if not bool((scores > 0).any()):
            scores = torch.ones_like(scores)
        chosen = torch.multinomial(scores, count, replacement=count > len(self.entries), generator=self.generator)
        return [(self.entries[i][2], self.entries[i][3]) for i in chosen.tolist()]

    def refill(self, rollout: Rollout, step: int) -> tuple[Rollout, dict[str, float]]:
        """`rollout` with every group whose rewards all agree replaced (the informative groups first, then the
        replayed ones; unchanged while the buffer is empty), and what was done. Needs `reward` and `advantages`."""
        group_size = rollout.group_size
        flat = zero_variance_group_mask(rollout.reward, group_size)
        scores = group_scores(rollout).tolist()
        for g in (~flat).nonzero().squeeze(-1).tolist():
            if len(self.entries) < self.size or scores[g] > self.entries[0][0]:  # selected only if it gets in
                self.add(rollout.select(slice(g * group_size, (g + 1) * group_size)), scores[g], step)
        to_replace = flat.nonzero().squeeze(-1).tolist()
        self._drop_unlike(rollout)
        if self.max_age is not None:  # groups sampled more than max_age steps ago leave
            self.entries = [entry for entry in self.entries if step - entry[2] <= self.max_age]
            heapq.heapify(self.entries)
        stats = {"replaced": 0.0, "age_mean": float("nan"), "size": float(len(self))}
        if not to_replace or not self.entries:
            return rollout, stats
        drawn = self.draw(len(to_replace))
        device = rollout.response_ids.device
        replayed = [group.to(device) for _, group in drawn]
        kept = rollout.select((~flat).repeat_interleave(group_size).nonzero().squeeze(-1))
        stats.update(replaced=float(len(drawn)), age_mean=sum(step - s for s, _ in drawn) / len(drawn))
        return Rollout.concat([kept, *replayed]), stats

    def _drop_unlike(self, rollout: Rollout) -> None:
        """Groups stored with other optional fields than this step's (a run resumed under other options: a KL
        reference added, ...) cannot join its rollout: a field one part lacks is dropped for all parts."""
        like = [
            e
            for e in self.entries
            if all((getattr(e[3], n) is None) == (getattr(rollout, n) is None) for n in OPTIONAL)
        ]
        if len(like) < len(self.entries):
            log.warning("replay buffer: %d groups stored under other options dropped", len(self.entries) - len(like))
            self.entries = like
            heapq.heapify(self.entries)

    def state_dict(self) -> dict[str, Any]:
        entries = [
            (score, order, step, {f.name: getattr(group, f.name) for f in dataclasses.fields(Rollout)})
            for score, order, step, group in self.entries
        ]
        return {"entries": entries, "added": self.added, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = [(score, order, step, Rollout(**fields)) for score, order, step, fields in state["entries"]]
        heapq.heapify(self.entries)
        if len(self.entries) > self.size:  # resumed with a smaller buffer: keep the best
            self.entries = heapq.nlargest(self.size, self.entries)
            heapq.heapify(self.entries)
        self.added = int(state["added"])
        self.generator.set_state(state["generator"])


def replay_buffer(config: ReplayConfig, update: PolicyUpdate) -> GroupReplayBuffer | None:
    """The buffer `replay` asks for (None for size 0). A replayed group's ratio is to the policy that sampled it, so
    the update keeps old log-probs even for a single update per rollout."""
    update.keeps_old_log_probs = config.size > 0
    return GroupReplayBuffer(config.size, torch.initial_seed(), config.max_age) if config.size else None


def ranks_state_dict(buffer: GroupReplayBuffer) -> dict[str, Any]:
    """Every rank's buffer, gathered to each (a checkpoint is written by rank 0 from the dict every rank builds)."""
    state = buffer.state_dict()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {"ranks": [state]}
    states: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return {"ranks": states}


def load_ranks_state_dict(buffer: GroupReplayBuffer, state: dict[str, Any], rank: int, world_size: int) -> None:
    """This rank's buffer from `ranks_state_dict`'s; saved by another number of ranks, the buffers start empty."""
    ranks = state["ranks"]
    if len(ranks) != world_size:
        log.warning("replay buffers saved by %d ranks, resumed on %d: they start empty", len(ranks), world_size)
        return
    buffer.load_state_dict(ranks[rank])
