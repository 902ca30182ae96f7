"""A*-PO's least-squares loss: the policy's implicit reward regressed onto the optimal advantage.

Brantley et al. 2025 ("Accelerating RL for LLM Reasoning with Optimal Advantage Regression", arXiv:2505.20686)
write the KL-regularised optimum as ``beta log(pi*(y|x) / pi_ref(y|x)) = r(x, y) - V*(x)`` and fit the policy to
it by least squares on one response per prompt:

    l(x, y) = (beta2 log(pi_theta(y|x) / pi_ref(y|x)) - (r(x, y) - V*(x)))^2

with the advantage ``r - V*`` from `advantages.OptimalValueAdvantage`. The sequence log-ratio sums the response's
tokens, so the loss is one number per response: every token of a row carries it, and ``seq-mean-token-mean``
averages the rows (the paper's mean over the batch).
"""

from __future__ import annotations

from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss, PolicyLossOutput, prepare_inputs, zero_masked

#: the aggregations A*-PO accepts: each response's squared error counts once
ASTAR_PO_AGGREGATIONS = ("seq-mean-token-mean",)


class AStarPO(PolicyLoss):
    """``(beta2 sum_t log(pi_theta / pi_ref) - A)^2`` per response (see the module docstring); reads the reference
    log-probs (``reads_reference``), never the old ones."""

    needs_old_log_probs = False
    reads_reference = True

    def __init__(self, beta2: float = 1e-3) -> None:
        if not beta2 > 0:
            raise ValueError(f"AStarPO: beta2 must be > 0, got {beta2}")
        self.beta2 = beta2

    def check(self, aggregation: str) -> None:
        if aggregation not in ASTAR_PO_AGGREGATIONS:
            raise ValueError(
                f"A*-PO's loss is one squared error per response; aggregation.mode={aggregation!r} would weigh "
                f"responses by their length. Use aggregation: {{mode: {ASTAR_PO_AGGREGATIONS[0]}}}."
            )

    def __call__(self, log_probs, old_log_probs, advantages, mask, ref_log_probs: Tensor | None = None):
        _, adv, m = prepare_inputs(log_probs, None, advantages, mask)
        if ref_log_probs is None:
            raise ValueError("AStarPO regresses log(pi / pi_ref): it needs the reference's log-probs (ref_log_probs)")
        if adv.shape[1] != 1:
            raise ValueError("AStarPO takes one advantage per response (r - V*), got per-token advantages")
        log_ratio = zero_masked(log_probs - ref_log_probs.to(log_probs.dtype), m).sum(-1, keepdim=True)
        implicit_reward = self.beta2 * log_ratio
        # l = (beta2 log(pi / pi_ref)(y|x) - (r - V*(x)))^2  (Brantley et al. 2025 A*-PO, arXiv:2505.20686, stage 2;
        # TRL A2POTrainer.compute_loss)
        loss = (implicit_reward - adv).square().expand_as(log_probs)
        stats = {"implicit_reward": implicit_reward.detach().mean()}
        return PolicyLossOutput(zero_masked(loss, m), log_probs.new_ones(log_probs.shape), m, extra_stats=stats)
