"""Length shaping: `LengthReward` (Kimi k1.5) and `OverlongPenalty` (DAPO). Lengths are response tokens.

`LengthReward` (Kimi Team 2025, "Kimi k1.5", section 2.3.3, length penalty): within each group
(the responses to one prompt), with ``min``/``max`` the shortest/longest response length,

    lambda = 0.5 - (len - min) / (max - min)        (0 when every response has the same length)
    reward = lambda            for a correct response
             min(0, lambda)    for a wrong one

so short correct answers gain up to +0.5, and long wrong ones lose up to -0.5 without wrong
ones ever being rewarded. Correctness is read from another reward's scores in
``rollout.rewards`` (``correct_reward``, by default the first ``kind: task`` reward in
``trainer.callbacks``), so list this reward after that one.

`OverlongPenalty` (Yu et al. 2025, "DAPO", eq. 13, soft overlong punishment): 0 up to
``max_len - buffer`` tokens, then falling linearly to ``-penalty`` at ``max_len``, and
``-penalty`` beyond.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.math.MathAccuracyReward
        - class_path: rlvr_lightning.rewards.length.LengthReward
          init_args: {weight: 0.1}
        - class_path: rlvr_lightning.rewards.length.OverlongPenalty
          init_args: {max_len: 1024, buffer: 256}
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout


def response_lengths(rollout: Rollout) -> Tensor:
    """Response tokens per row (`float[N]`), tool observations and forced tokens included: the length the
    token budget (`max_new_tokens`) counts, as verl's overlong penalty does; not only the sampled tokens."""
    return rollout.response_lengths()


def kimi_length_reward(lengths: Tensor, correct: Tensor, group_size: int) -> Tensor:
    """The Kimi k1.5 length reward for rows in contiguous groups of `group_size` (see the module docstring)."""
    if lengths.numel() % group_size:
        raise ValueError(f"{lengths.numel()} rows are not whole groups of {group_size}")
    grouped = lengths.float().view(-1, group_size)
    low = grouped.min(-1, keepdim=True).values
    high = grouped.max(-1, keepdim=True).values
    span = high - low
    lam = torch.where(span > 0, 0.5 - (grouped - low) / span.clamp_min(1e-12), torch.zeros_like(grouped)).view(-1)
    return torch.where(correct.bool(), lam, lam.clamp(max=0.0))


class LengthReward(RewardCallback):
    """Kimi k1.5 length reward: favours the shorter responses of a group, never rewards wrong ones."""

    kind = "shaping"

    def __init__(
        self,
        correct_reward: str | None = None,
        correct_threshold: float = 1.0,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            correct_reward: name of the reward whose score says whether a response is correct; None
                picks the first ``kind: task`` reward in ``trainer.callbacks``.
            correct_threshold: a response is correct when that score is at least this.
        """
        super().__init__(weight=weight, name=name or "length", on_error=on_error)
        self.correct_reward = correct_reward
        self.correct_threshold = correct_threshold
        self._resolved: str | None = correct_reward

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.correct_reward is not None:
            return
        for callback in trainer.callbacks:
            if callback is self:
                break
            if isinstance(callback, RewardCallback) and callback.kind == "task":
                self._resolved = callback.name
                return
        raise ValueError(
            "LengthReward: no kind='task' reward before it in trainer.callbacks to tell correct responses; "
            "list the task reward (e.g. MathAccuracyReward) first or set correct_reward"
        )

    def __call__(self, rollout: Rollout) -> Tensor:
        # A missing correctness signal is a configuration error, not a bad row: raise whatever on_error says.
        if self._resolved is None or self._resolved not in rollout.rewards:
            raise ValueError(
                f"LengthReward needs the scores of reward {self._resolved!r} in rollout.rewards "
                f"(have {sorted(rollout.rewards)}); list that reward before LengthReward in trainer.callbacks"
            )
        return super().__call__(rollout)

    def score(self, rollout: Rollout) -> Tensor:
        correct = rollout.rewards[self._resolved] >= self.correct_threshold
        return kimi_length_reward(response_lengths(rollout), correct, rollout.group_size).to(
            rollout.response_ids.device
        )


class OverlongPenalty(RewardCallback):
    """DAPO soft overlong punishment: 0 up to `max_len - buffer` tokens, linear to `-penalty` at `max_len`."""

    kind = "shaping"

    def __init__(
        self,
        max_len: int,
        buffer: int,
        penalty: float = 1.0,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            max_len: the length (tokens) at which the full penalty applies, usually `sampling.max_new_tokens`.
            buffer: the penalty ramps over the last `buffer` tokens before `max_len`.
            penalty: the magnitude of the penalty at (and beyond) `max_len`.
        """
        if not 0 < buffer <= max_len:
            raise ValueError(f"OverlongPenalty needs 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}")
        super().__init__(weight=weight, name=name or "overlong_penalty", on_error=on_error)
        self.max_len = max_len
        self.buffer = buffer
        self.penalty = penalty

    def score(self, rollout: Rollout) -> Tensor:
        return self.penalty_of(response_lengths(rollout))

    def penalty_of(self, lengths: Tensor) -> Tensor:
        over = (lengths.float() - (self.max_len - self.buffer)).clamp(min=0.0, max=float(self.buffer))
        return -self.penalty * over / self.buffer


__all__ = ["LengthReward", "OverlongPenalty", "kimi_length_reward", "response_lengths"]
