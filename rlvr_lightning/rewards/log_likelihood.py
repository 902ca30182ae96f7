"""`MeanLogProbReward`: EM-RL's label-free reward (Agarwal et al. 2025, "The Unreasonable Effectiveness of Entropy
Minimization in LLM Reasoning", arXiv:2505.15134, sec. 2.2, EM-RL-sequence): the mean log-probability of a
response's tokens under the policy that sampled it, the negative of a one-sample estimate of its entropy per token.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.MeanLogProbReward
        - class_path: rlvr_lightning.rewards.MathAccuracyReward   # the ground truth, watched only
          init_args: {weight: 0.0}

No ground truth is read: the policy is rewarded for the responses it is most confident of, which sharpens it. The
log-probs are those the generator recorded while sampling (`rollout.sampling_log_probs`: under the unfiltered
`softmax(logits / temperature)`, as the authors' code reads its old log-probs); a generator that does not record
them (an engine that renormalises after top-k/top-p) makes every row fail, which stops the run at its first step.
A response without a sampled token scores `failure_value`, -20 nats, below any sampled response. Its `kind` is
"shaping": accuracy comes from a task reward such as `MathAccuracyReward` at `weight: 0`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.masked import masked_mean
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout


class MeanLogProbReward(RewardCallback):
    """The mean over a response's sampled tokens of their log-probability when sampled (nats, <= 0)."""

    kind = "shaping"
    failure_value = -20.0

    def score(self, rollout: Rollout) -> Tensor:
        if rollout.sampling_log_probs is None:
            raise ValueError(
                f"{type(self).__name__} reads the log-probs the generator recorded while sampling "
                "(rollout.sampling_log_probs), which this policy or engine does not record"
            )
        mask = rollout.response_mask
        # r_i = (1/|o_i|) sum_t log pi(o_t | q, o_<t): EM-RL-sequence's reward (the authors' emrl_sequence_manager)
        scores = masked_mean(rollout.sampling_log_probs.float(), mask, dim=-1)
        return torch.where(mask.sum(-1) > 0, scores, torch.full_like(scores, float("nan")))


__all__ = ["MeanLogProbReward"]
