"""`UnlikelinessReward` (He, Fried and Welleck 2025, "Rewarding the Unlikely: Lifting GRPO Beyond Distribution
Sharpening", arXiv:2506.02355, EMNLP 2025): a correct response that its policy found likely earns less than a correct
response it found unlikely, so the update lifts the rare solutions too instead of sharpening the distribution around
the solutions it already finds (the paper's "rank bias", which costs pass@N at large N).

Within each group the responses are ranked by the mean log-probability of their sampled tokens under the policy that
sampled them (rank 0 the least likely, G - 1 the most likely): those the generator recorded while sampling
(`rollout.sampling_log_probs`), or where it records none (`ToySortPolicy`, an engine that renormalises after top-k or
top-p) the trainer's, one forward without gradients micro-batch by micro-batch before the update, as the authors'
old log-probs. A response's score is

    -penalty * rank / G * task score

so that with the task reward at weight 1 the total is the authors' `R * (1 - penalty * rank / G)`: a wrong response
(score 0) is untouched, the least likely correct one keeps its reward, the most likely loses `penalty * (G - 1) / G`
of it. The task score is the raw score of another reward in `rollout.rewards` (``correct_reward``: by default the
first ``kind: task`` reward listed before this one); give this reward that reward's weight to scale the product.
The authors train with `penalty` 0.25 (their `lean.rank_penalty`) and 2 PPO epochs a batch, their second remedy
for the bias (`update.epochs`).

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.MathAccuracyReward
        - class_path: rlvr_lightning.rewards.UnlikelinessReward
          init_args: {penalty: 0.25}
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from rlvr_lightning.core.masked import masked_mean
from rlvr_lightning.rewards.length import CorrectnessShaping
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import Range


def likelihood_ranks(mean_log_probs: Tensor, group_size: int) -> Tensor:
    """Each row's rank within its group of `group_size` contiguous rows by `mean_log_probs`, ascending (0: the least
    likely); ties keep row order; a NaN (a response without a sampled token) ranks below every other row."""
    if mean_log_probs.numel() % group_size:
        raise ValueError(f"{mean_log_probs.numel()} rows are not whole groups of {group_size}")
    grouped = torch.nan_to_num(mean_log_probs.float(), nan=float("-inf")).view(-1, group_size)
    order = torch.argsort(grouped, dim=-1, stable=True)
    return torch.argsort(order, dim=-1, stable=True).view(-1)


def unlikeliness_scores(task_scores: Tensor, mean_log_probs: Tensor, group_size: int, penalty: float) -> Tensor:
    """`-penalty * rank / G * task_score` per row (see the module docstring)."""
    ranks = likelihood_ranks(mean_log_probs, group_size).to(task_scores.device)
    # r_i <- r_i (1 - beta_rank * rank_i / G), rank ascending in the old policy's mean token log-prob (He et al. 2025,
    # arXiv:2506.02355 sec. 4; the authors' _compute_advantages, AndreHe02/rewarding-unlikely-release ca1cff0)
    return -penalty * ranks.to(task_scores.dtype) / group_size * task_scores


@documented_options
class UnlikelinessReward(CorrectnessShaping):
    """Takes `penalty * rank / G` of a correct response's task score, the likelier responses of its group ranking
    higher (see the module docstring)."""

    def __init__(
        self,
        penalty: Annotated[
            float, Option("the share of the task score the group's likeliest response loses (x (G-1)/G).", Range(0, 1))
        ] = 0.25,
        correct_reward: str | None = None,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        check_options(UnlikelinessReward, locals())
        super().__init__(correct_reward, weight=weight, name=name, on_error=on_error)
        self.penalty = penalty

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        group_size = getattr(pl_module, "group_size", None)
        if group_size is not None and group_size < 2:
            raise ValueError(
                f"{type(self).__name__} ranks the responses within each group, but group_size={group_size}: "
                "every response would rank first and keep its reward; sample at least 2 per prompt"
            )
        self.module = pl_module

    def score(self, rollout: Rollout) -> Tensor:
        log_probs = rollout.sampling_log_probs
        if log_probs is None:
            log_probs = self._trainer_log_probs(rollout)
        mask = rollout.response_mask
        mean_log_probs = masked_mean(log_probs.float(), mask, dim=-1)
        mean_log_probs = torch.where(mask.sum(-1) > 0, mean_log_probs, torch.full_like(mean_log_probs, float("nan")))
        task_scores = self.task_scores(rollout).float()
        return unlikeliness_scores(task_scores, mean_log_probs, rollout.group_size, self.penalty)

    def _trainer_log_probs(self, rollout: Rollout) -> Tensor:
        module = getattr(self, "module", None)
        update = getattr(module, "policy_update", None)
        if update is None:
            raise ValueError(
                f"{type(self).__name__} ranks responses by their log-probs: the generator recorded none "
                "(rollout.sampling_log_probs) and there is no trainer's policy to score them (outside a run)"
            )

        def log_probs(rows: Rollout) -> Tensor:
            return module.policy.token_log_probs(rows, update.temperature)[0]

        with torch.no_grad():
            return update.by_micro_batch(rollout, log_probs)


__all__ = ["UnlikelinessReward", "likelihood_ranks", "unlikeliness_scores"]
