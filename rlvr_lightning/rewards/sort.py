"""Rewards of the sorting task (CS336 spring 2025, lecture 17: `sort_distance_reward`,
`sort_inclusion_ordering_reward`), vectorised over the batch."""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout


def _sorted_prompts(rollout: Rollout) -> Tensor:
    return rollout.prompt_ids.sort(dim=-1).values


def _exact_sort(rollout: Rollout) -> Tensor:
    target = _sorted_prompts(rollout)
    response = rollout.response_ids
    if response.shape[1] != target.shape[1]:
        return torch.zeros(rollout.num_rows, dtype=torch.bool, device=response.device)
    return (response == target).all(dim=-1)


class SortDistanceReward(RewardCallback):
    """Number of response positions equal to the sorted prompt (lecture: `sort_distance_reward`)."""

    def score(self, rollout: Rollout) -> Tensor:
        target = _sorted_prompts(rollout)
        length = min(target.shape[1], rollout.response_ids.shape[1])
        return (rollout.response_ids[:, :length] == target[:, :length]).sum(dim=-1).float()

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return _exact_sort(rollout)


class SortInclusionOrderingReward(RewardCallback):
    """One point per prompt token present in the response plus one per adjacent non-decreasing
    response pair (lecture: `sort_inclusion_ordering_reward`; maximum 2L - 1).

    The lecture counts a prompt token as included when it appears anywhere in the response, so
    prompt [3, 3] and response [3, 0] scores inclusion 2; `multiset=True` matches occurrences
    one-to-one (inclusion 1).
    """

    def __init__(self, multiset: bool = False, **kwargs) -> None:
        """`kwargs`: `weight`, `name`, `on_error`, `timeout_s` of `RewardCallback`."""
        super().__init__(**kwargs)
        self.multiset = multiset

    def score(self, rollout: Rollout) -> Tensor:
        prompt, response = rollout.prompt_ids, rollout.response_ids
        if self.multiset:
            vocab = int(max(prompt.max(), response.max())) + 1
            prompt_counts = torch.zeros(prompt.shape[0], vocab, device=prompt.device).scatter_add_(
                1, prompt, torch.ones_like(prompt, dtype=torch.float)
            )
            response_counts = torch.zeros(response.shape[0], vocab, device=response.device).scatter_add_(
                1, response, torch.ones_like(response, dtype=torch.float)
            )
            inclusion = torch.minimum(prompt_counts, response_counts).sum(dim=-1)
        else:
            inclusion = (prompt.unsqueeze(-1) == response.unsqueeze(-2)).any(dim=-1).sum(dim=-1).float()
        ordering = (response[:, 1:] >= response[:, :-1]).sum(dim=-1).float()
        return inclusion + ordering

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        return _exact_sort(rollout)


STOP_RULES = ("exact", "any")


class SortAndStopReward(RewardCallback):
    """The sort task for a policy that ends its responses (an EOS token): one point per position where the
    response, before it ends, matches the sorted prompt, plus `stop_bonus` when it stops as `stop` says:

    * "exact": EOS right after the sorted tokens (responses that stop early lose the positions they did not
      reach; responses that run on lose the bonus);
    * "any": EOS anywhere after them; a response cut off at the generation budget (no EOS) scores 0, as an
      unfinished math solution has no answer. What follows the answer is free, so response lengths are the
      policy's choice: the task of `configs/length_bias/`, where GRPO's length bias shows.

    Correct: every position matched, and stopped."""

    def __init__(self, stop_bonus: float = 1.0, stop: str = "exact", **kwargs) -> None:
        """`kwargs`: `weight`, `name`, `on_error`, `timeout_s` of `RewardCallback`."""
        super().__init__(**kwargs)
        if stop not in STOP_RULES:
            raise ValueError(f"stop={stop!r} is not valid; choose one of {list(STOP_RULES)}")
        self.stop_bonus = stop_bonus
        self.stop = stop

    def _matches_and_stop(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        target = _sorted_prompts(rollout)
        answer_length = target.shape[1]
        width = min(answer_length, rollout.response_ids.shape[1])
        mask = rollout.response_mask.bool()
        matches = (rollout.response_ids[:, :width] == target[:, :width]) & mask[:, :width]
        length = mask.sum(dim=-1)
        # the response (EOS included) is one token longer than the answer (or longer, for "any") and was not cut off
        stopped = (length == answer_length + 1) if self.stop == "exact" else (length > answer_length)
        return matches.sum(dim=-1), stopped & ~rollout.truncated

    def score(self, rollout: Rollout) -> Tensor:
        matches, stopped = self._matches_and_stop(rollout)
        scores = matches.float() + self.stop_bonus * stopped.float()
        return scores if self.stop == "exact" else torch.where(rollout.truncated, 0.0, scores)

    def is_correct(self, rollout: Rollout, scores: Tensor) -> Tensor:
        matches, stopped = self._matches_and_stop(rollout)
        return (matches == rollout.prompt_ids.shape[1]) & stopped
