"""Label-free rewards read from the trained policy's own next-token distributions: the more certain the policy is
along a response, the higher its reward.

* `SelfCertaintyReward`, INTUITOR (Zhao et al. 2025, "Learning to Reason without External Rewards",
  arXiv:2505.19590): the mean over a response's tokens of `KL(U || p)`, how far each distribution is from uniform.
* `NegativeEntropyReward`, RENT (Prabhudesai et al. 2025, "Maximizing Confidence Alone Improves Reasoning",
  arXiv:2505.22660): minus the mean over a response's tokens of the entropy of each distribution.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.SelfCertaintyReward
        - class_path: rlvr_lightning.rewards.MathAccuracyReward   # the ground truth, watched only
          init_args: {weight: 0.0}

No ground truth is read. Unlike EM-RL's `MeanLogProbReward`, which reads the sampled token's probability alone,
these read the whole distribution at each position, so they are computed from the trained policy's logits: one
forward without gradients over the rollout (micro-batch by micro-batch, as the update scores), at the sampling
temperature, before the step's update, i.e. by the policy that sampled the rollout (the authors' verl code computes
both in the old log-probs' forward, on temperature-scaled logits). The policy must implement
`Policy.logit_statistics` (`HFPolicy` and `ToySortPolicy` do). With `unanswered_score` a response without a
`\\boxed{...}` answer scores that instead (RENT's format rule: -7 nats). A response without a sampled token scores
`failure_value`. Their `kind` is "shaping": accuracy comes from a task reward such as `MathAccuracyReward` at
`weight: 0`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.log_probs import self_certainty_from_logits, token_entropy_from_logits
from rlvr_lightning.core.masked import masked_mean
from rlvr_lightning.grading.answers import extract_boxed
from rlvr_lightning.policies.base import LogitStatistic, Policy
from rlvr_lightning.rewards.base import DEFAULT_ROW_TIMEOUT_S, RewardCallback
from rlvr_lightning.rewards.math import response_texts
from rlvr_lightning.rollout import Rollout


class ConfidenceReward(RewardCallback):
    """Base class: `sign` times the mean over a response's tokens of `statistic` of the trained policy's logits at the
    sampling temperature."""

    kind = "shaping"
    statistic: LogitStatistic
    sign = 1.0

    def __init__(
        self,
        unanswered_score: float | None = None,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
        timeout_s: float | None = DEFAULT_ROW_TIMEOUT_S,
    ) -> None:
        """
        Args:
            unanswered_score: the score of a response without a `\\boxed{...}` answer (RENT: -7.0); None: every
                response scores its confidence.
            weight: as `RewardCallback`'s (and `name`, `on_error`, `timeout_s`).
        """
        super().__init__(weight=weight, name=name, on_error=on_error, timeout_s=timeout_s)
        self.unanswered_score = unanswered_score

    def setup(self, trainer, pl_module, stage: str) -> None:
        policy = getattr(pl_module, "policy", None)
        if not isinstance(policy, Policy) or type(policy).logit_statistics is Policy.logit_statistics:
            owner = type(policy).__name__ if policy is not None else f"{type(pl_module).__name__} (no policy)"
            raise ValueError(
                f"{type(self).__name__} reads the trained policy's logits, which {owner} does not give: implement "
                "Policy.logit_statistics"
            )
        self.module = pl_module

    def score(self, rollout: Rollout) -> Tensor:
        module = getattr(self, "module", None)
        if module is None:
            raise RuntimeError(f"{type(self).__name__} scores in a fit, validate or test run (setup was not called)")
        update = getattr(module, "policy_update", None)
        temperature = update.temperature if update is not None else module.sampling.temperature
        statistic = type(self).statistic

        def per_token(rows: Rollout) -> Tensor:
            return module.policy.logit_statistics(rows, statistic, temperature)

        with torch.no_grad():
            values = update.by_micro_batch(rollout, per_token) if update is not None else per_token(rollout)
        mask = rollout.response_mask
        # r_i = sign (1/|o_i|) sum_t s(pi(. | q, o_<t)): the masked mean over the response (Intuitor's and RENT's verl
        # ray_trainer.py: the mean of self_certaintys / entropys over the response's valid tokens)
        scores = self.sign * masked_mean(values.float(), mask, dim=-1)
        scores = torch.where(mask.sum(-1) > 0, scores, torch.full_like(scores, float("nan")))
        if self.unanswered_score is not None:
            # RENT's base_format: no extracted answer -> entropy_base (7.0) in place of the entropy, negated
            unanswered = [extract_boxed(text) is None for text in response_texts(rollout, type(self).__name__)]
            scores[torch.tensor(unanswered, device=scores.device)] = self.unanswered_score
        return scores


class SelfCertaintyReward(ConfidenceReward):
    """INTUITOR: the mean over a response's tokens of `KL(U || p)` (nats, >= 0; 0 for uniform distributions).
    A response without a sampled token scores `failure_value`, 0."""

    statistic = staticmethod(self_certainty_from_logits)
    failure_value = 0.0


class NegativeEntropyReward(ConfidenceReward):
    """RENT: minus the mean over a response's tokens of the entropy of `p` (nats, <= 0; 0 for certain ones).
    A response without a sampled token scores `failure_value`, -7 (RENT's score of a response without an answer)."""

    statistic = staticmethod(token_entropy_from_logits)
    sign = -1.0
    failure_value = -7.0


__all__ = ["ConfidenceReward", "NegativeEntropyReward", "SelfCertaintyReward"]
