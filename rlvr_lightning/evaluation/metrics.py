"""Validation metrics over groups of k sampled responses per prompt, as torchmetrics.

* `PassAtK(k)`: mean over prompts of the unbiased pass@k estimator (Chen et al. 2021) from the
  group's n >= k samples;
* `MajorityVoteAccuracy()`: per prompt, the most common (normalised, non-None) answer of the group
  wins (ties: the first seen); the prompt counts as solved when a row with that answer is correct;
  a prompt without any answer counts as wrong;
* `ValidationMetrics`: accuracy, pass@k, majority-vote accuracy, format rate and mean response
  length of a validation pass, one `update` per validation rollout.

States are sums with ``dist_reduce_fx="sum"``, so the values are exact under DDP.

Rows of a rollout come in contiguous groups of ``group_size`` (one group per prompt), as
`rlvr_lightning.rollout.Rollout` documents.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric

from rlvr_lightning.core.pass_at_k import pass_at_k_tensor
from rlvr_lightning.grading.answers import majority_vote
from rlvr_lightning.rollout import Rollout


def _grouped(values: Tensor, group_size: int) -> Tensor:
    if group_size < 1 or values.numel() % group_size:
        raise ValueError(f"{values.numel()} rows are not whole groups of group_size={group_size}")
    return values.reshape(-1, group_size)


class PassAtK(Metric):
    """Mean unbiased pass@k over prompts. `update(correct: bool[N], group_size)`, rows grouped by prompt."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, k: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        if k < 1:
            raise ValueError(f"pass@k needs k >= 1, got {k}")
        self.k = k
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("prompts", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, correct: Tensor, group_size: int) -> None:
        if self.k > group_size:
            raise ValueError(f"pass@{self.k} needs at least {self.k} samples per prompt, got group_size={group_size}")
        counts = _grouped(correct.bool(), group_size).sum(-1)
        estimate = pass_at_k_tensor(group_size, counts, self.k)
        self.total += estimate.to(self.total).sum()
        self.prompts += counts.numel()

    def compute(self) -> Tensor:
        return (self.total / self.prompts.clamp_min(1)).float()


class MajorityVoteAccuracy(Metric):
    """Share of prompts whose majority answer is a correct one. `update(answers, correct, group_size)`."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("solved", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("prompts", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, answers: Sequence[str | None], correct: Tensor, group_size: int) -> None:
        if len(answers) != correct.numel():
            raise ValueError(f"{len(answers)} answers but {correct.numel()} correctness flags")
        flags = _grouped(correct.bool(), group_size).tolist()
        solved = 0
        for g, row_flags in enumerate(flags):
            group = list(answers[g * group_size : (g + 1) * group_size])
            winner = majority_vote(group)
            if winner is not None and any(ok for a, ok in zip(group, row_flags, strict=True) if a == winner):
                solved += 1
        self.solved += solved
        self.prompts += len(flags)

    def compute(self) -> Tensor:
        return self.solved.float() / self.prompts.clamp_min(1)


class ValidationMetrics(nn.Module):
    """Accuracy, pass@k, majority-vote accuracy, format rate and mean response length of a validation pass.

    `update(rollout, correct, answers, format_ok)` once per validation batch (each argument but the
    rollout may be None: that metric then gets no data); `compute()` returns only the metrics that
    had data, under the keys ``accuracy``, ``pass@{k}``, ``majority_vote_accuracy``, ``format_rate``,
    ``response_length`` (response tokens, masked); `reset()` before the next pass.
    """

    def __init__(self, group_size: int = 1, ks: Sequence[int] | None = None) -> None:
        """`ks` are the k of the pass@k metrics; the default is `[group_size]`."""
        super().__init__()
        self.group_size = group_size
        ks = list(ks) if ks is not None else [group_size]
        if any(k > group_size for k in ks):
            raise ValueError(f"pass@k needs k <= group_size={group_size}, got ks={ks}")
        self.accuracy = MeanMetric()
        self.pass_at_k = nn.ModuleDict({str(k): PassAtK(k) for k in ks})
        self.majority_vote_accuracy = MajorityVoteAccuracy()
        self.format_rate = MeanMetric()
        self.response_length = MeanMetric()

    def update(
        self,
        rollout: Rollout,
        correct: Tensor | None = None,
        answers: Sequence[str | None] | None = None,
        format_ok: Tensor | None = None,
    ) -> None:
        group_size = rollout.group_size
        self.response_length.update(rollout.response_lengths())
        if correct is not None:
            correct = correct.bool()
            self.accuracy.update(correct.float())
            for metric in self.pass_at_k.values():
                metric.update(correct, group_size)
            if answers is not None:
                self.majority_vote_accuracy.update(answers, correct, group_size)
        if format_ok is not None:
            self.format_rate.update(format_ok.float())

    def _metrics(self) -> dict[str, Metric]:
        metrics: dict[str, Metric] = {"accuracy": self.accuracy}
        metrics.update({f"pass@{k}": m for k, m in self.pass_at_k.items()})
        metrics["majority_vote_accuracy"] = self.majority_vote_accuracy
        metrics["format_rate"] = self.format_rate
        metrics["response_length"] = self.response_length
        return metrics

    def compute(self) -> dict[str, Tensor]:
        return {name: metric.compute() for name, metric in self._metrics().items() if metric.update_count > 0}

    def reset(self) -> None:
        for metric in self._metrics().values():
            metric.reset()


__all__ = ["MajorityVoteAccuracy", "PassAtK", "ValidationMetrics", "majority_vote"]
