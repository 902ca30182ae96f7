"""Length shaping: `LengthReward` (Kimi k1.5), `CosineLengthReward` (Yeo et al. 2025) and `OverlongPenalty`
(DAPO). Lengths are response tokens.

`LengthReward` (Kimi Team 2025, "Kimi k1.5", section 2.3.3, length penalty): within each group
(the responses to one prompt), with ``min``/``max`` the shortest/longest response length,

    lambda = 0.5 - (len - min) / (max - min)        (0 when every response has the same length)
    reward = lambda            for a correct response
             min(0, lambda)    for a wrong one

so short correct answers gain up to +0.5, and long wrong ones lose up to -0.5 without wrong
ones ever being rewarded. Correctness is read from another reward's scores in
``rollout.rewards`` (``correct_reward``, by default the first ``kind: task`` reward in
``trainer.callbacks``), so list this reward after that one.

`CosineLengthReward` (Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning in LLMs",
arXiv:2502.03373, §4.2 and Appendix C.1): the correctness reward scaled by the length on a cosine, from
``correct_short`` at 0 tokens to ``correct_long`` at ``max_len`` for a correct response, and from
``wrong_short`` to ``wrong_long`` for a wrong one; ``exceed`` for a response cut off at the token budget.
With the paper's values (2 -> 1, -10 -> 0, -10) a correct response gains by being short and a wrong one by
being long (it may still be reasoning). It replaces the task reward: give that one ``weight: 0``.

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

import math
from typing import Annotated

import torch
from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import FINITE, Range

POSITIVE_OR_NULL = Range(1, integer=True, optional=True)


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


class CorrectnessShaping(RewardCallback):
    """A shaping reward that reads which responses are correct from another reward's scores in
    ``rollout.rewards`` (``correct_reward``: by default the first ``kind: task`` reward before it in
    ``trainer.callbacks``); `correct(rollout)` is bool ``[N]``."""

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
        super().__init__(weight=weight, name=name, on_error=on_error)
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
            f"{type(self).__name__}: no kind='task' reward before it in trainer.callbacks to tell correct "
            "responses; list the task reward (e.g. MathAccuracyReward) first or set correct_reward"
        )

    def __call__(self, rollout: Rollout) -> Tensor:
        # A missing correctness signal is a configuration error, not a bad row: raise whatever on_error says.
        if self._resolved is None or self._resolved not in rollout.rewards:
            raise ValueError(
                f"{type(self).__name__} needs the scores of reward {self._resolved!r} in rollout.rewards "
                f"(have {sorted(rollout.rewards)}); list that reward before {type(self).__name__} in "
                "trainer.callbacks"
            )
        return super().__call__(rollout)

    def task_scores(self, rollout: Rollout) -> Tensor:
        """The raw scores of the reward that tells correct responses (``correct_reward``), ``[N]``."""
        return rollout.rewards[self._resolved]

    def correct(self, rollout: Rollout) -> Tensor:
        return self.task_scores(rollout) >= self.correct_threshold


class LengthReward(CorrectnessShaping):
    """Kimi k1.5 length reward: favours the shorter responses of a group, never rewards wrong ones."""

    def score(self, rollout: Rollout) -> Tensor:
        return kimi_length_reward(response_lengths(rollout), self.correct(rollout), rollout.group_size).to(
            rollout.response_ids.device
        )


def cosine_length_reward(
    lengths: Tensor, correct: Tensor, truncated: Tensor, max_len: int, values: tuple[float, float, float, float, float]
) -> Tensor:
    """`CosineLengthReward`'s scores; ``values``: (correct_short, correct_long, wrong_short, wrong_long, exceed)."""
    correct_short, correct_long, wrong_short, wrong_long, exceed = values
    short = torch.where(correct.bool(), correct_short, wrong_short)
    long = torch.where(correct.bool(), correct_long, wrong_long)
    progress = (lengths.float() / max_len).clamp(max=1.0)
    # r = long + (short - long) (1 + cos(pi L_gen / L_max)) / 2  (Yeo et al. 2025, arXiv:2502.03373, Appendix C.1,
    # CosFn; the authors' CosineScaledSparseReward, eddycmu/demystify-long-cot e90cf9b), r_exceed when cut off
    scores = long + 0.5 * (short - long) * (1.0 + torch.cos(progress * math.pi))
    return torch.where(truncated.bool(), torch.full_like(scores, exceed), scores)


@documented_options
class CosineLengthReward(CorrectnessShaping):
    """The correctness reward scaled by the response's length on a cosine (see the module docstring)."""

    def __init__(
        self,
        max_len: Annotated[
            int | None,
            Option("the length of the cosine's half period (null: sampling.max_new_tokens).", POSITIVE_OR_NULL),
        ] = None,
        correct_short: Annotated[float, Option("a correct response's reward at 0 tokens.", FINITE)] = 2.0,
        correct_long: Annotated[float, Option("a correct response's reward at max_len tokens.", FINITE)] = 1.0,
        wrong_short: Annotated[float, Option("a wrong response's reward at 0 tokens.", FINITE)] = -10.0,
        wrong_long: Annotated[float, Option("a wrong response's reward at max_len tokens.", FINITE)] = 0.0,
        exceed: Annotated[float, Option("the reward of a response cut off at the token budget.", FINITE)] = -10.0,
        correct_reward: str | None = None,
        correct_threshold: float = 1.0,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        check_options(CosineLengthReward, locals())
        super().__init__(correct_reward, correct_threshold, weight, name, on_error)
        self.max_len = max_len
        self.values = (correct_short, correct_long, wrong_short, wrong_long, exceed)

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.max_len is None:
            sampling = getattr(pl_module, "sampling", None)
            if sampling is None:
                raise ValueError(f"CosineLengthReward: set max_len ({type(pl_module).__name__} has no sampling)")
            self.max_len = int(sampling.max_new_tokens)

    def score(self, rollout: Rollout) -> Tensor:
        if self.max_len is None:
            raise ValueError("CosineLengthReward: max_len is unset outside a run; pass it")
        lengths = response_lengths(rollout)
        truncated = rollout.truncated.to(lengths.device)
        return cosine_length_reward(
            lengths, self.correct(rollout).to(lengths.device), truncated, self.max_len, self.values
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


__all__ = [
    "CorrectnessShaping",
    "CosineLengthReward",
    "LengthReward",
    "OverlongPenalty",
    "cosine_length_reward",
    "kimi_length_reward",
    "response_lengths",
]
