"""`SelfCertaintyReward`: INTUITOR's label-free reward (Zhao et al. 2025, "Learning to Reason without External
Rewards", arXiv:2505.19590): a response's self-certainty, the mean over its tokens of `KL(U || p)`, how far the
policy's distribution at each position is from uniform.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.SelfCertaintyReward
        - class_path: rlvr_lightning.rewards.MathAccuracyReward   # the ground truth, watched only
          init_args: {weight: 0.0}

No ground truth is read: the policy is rewarded for the responses it is most certain of. Unlike EM-RL's
`MeanLogProbReward`, which reads the sampled token's probability alone, self-certainty reads the whole distribution
at each position, so it is computed from the trained policy's logits: one forward without gradients over the rollout
(micro-batch by micro-batch, as the update scores), at the sampling temperature, before the step's update, i.e. by
the policy that sampled the rollout (the authors' verl code computes it in the old log-probs' forward, on
temperature-scaled logits). The policy must implement `Policy.logit_statistics` (`HFPolicy` and `ToySortPolicy` do).
A response without a sampled token scores `failure_value`, 0 (a uniform distribution). Its `kind` is "shaping":
accuracy comes from a task reward such as `MathAccuracyReward` at `weight: 0`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.log_probs import self_certainty_from_logits
from rlvr_lightning.core.masked import masked_mean
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout


class SelfCertaintyReward(RewardCallback):
    """The mean over a response's tokens of `KL(U || p)` under the trained policy at the sampling temperature
    (nats, >= 0)."""

    kind = "shaping"
    failure_value = 0.0

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

        def certainty(rows: Rollout) -> Tensor:
            return module.policy.logit_statistics(rows, self_certainty_from_logits, temperature)

        with torch.no_grad():
            per_token = update.by_micro_batch(rollout, certainty) if update is not None else certainty(rollout)
        mask = rollout.response_mask
        # r_i = (1/|o_i|) sum_t KL(U || pi(. | q, o_<t))  (Zhao et al. 2025, eq. 4; Intuitor's verl ray_trainer: the
        # masked mean of self_certaintys over the response, its reward before GRPO's group normalisation)
        scores = masked_mean(per_token.float(), mask, dim=-1)
        return torch.where(mask.sum(-1) > 0, scores, torch.full_like(scores, float("nan")))


__all__ = ["SelfCertaintyReward"]
