"""`LUFFY`: a policy loss for groups that mix the policy's responses with demonstrations.

Yan et al. 2025, "Learning to Reason under Off-Policy Guidance" (LUFFY, arXiv:2504.14945): each group holds the
policy's own responses and off-policy ones (a stronger model's traces, the task's worked solutions), and its
advantages are computed over all of them (§3.2, eq. 4), so a group whose sampled responses all fail still learns
from its demonstration. A sampled token's loss is the on-policy loss. A demonstration token's is
``-A f(pi_theta(y_t))``: the importance ratio ``pi_theta / pi_demonstrator`` with the demonstrator's probability
taken as 1 (its probabilities are unknown), reshaped by the policy shaping ``f(p) = p / (p + gamma)`` (§3.3,
eq. 7), whose gradient ``A gamma p / (p + gamma)^2 grad log p`` stays large on the tokens the policy finds
unlikely, where the plain ratio's ``A p grad log p`` vanishes; it is never clipped. The authors' code:
``mix_core_alg.compute_token_on_off_policy_loss`` with ``off_policy_reshape="p_div_p_0.1"``
(``tests/core/test_off_policy_guidance.py`` restates it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss, PolicyLossOutput, prepare_inputs, zero_masked


def policy_shaping(probs: Tensor, gamma: float | None) -> Tensor:
    """``f(p) = p / (p + gamma)`` of each probability (Yan et al. 2025, LUFFY eq. 7); ``gamma=None``: ``p`` itself,
    the unshaped ratio with the demonstrator's probability taken as 1 (the paper's ablation)."""
    if gamma is None:
        return probs
    # f(p) = p / (p + gamma)  (LUFFY §3.3; mix_core_alg.py off_policy_reshape "p_div_p_0.1": gamma 0.1)
    return probs / (probs + gamma)


class LUFFY(PolicyLoss):
    """The on-policy loss on sampled rows, ``-A p / (p + gamma)`` on demonstration rows (``p = pi_theta(y_t)``;
    Yan et al. 2025, arXiv:2504.14945).

    The update hands the loss which rows are demonstrations (``demonstration_rows``, bool ``[N]``: the module's
    ``demonstrations`` option puts them in each group); without any it is the on-policy loss alone. The ratio
    statistics count every token (a demonstration token's ratio is its probability now over that when the step
    began, and it is never clipped); ``demonstration_prob`` is the mean probability of the demonstrations' tokens.

    Args:
        gamma: the policy shaping's constant (the paper's 0.1); smaller weighs unlikely tokens more. null: no
            shaping, ``-A p`` (the paper's ablation, whose gradient vanishes on unlikely tokens).
        on_policy: the loss of the sampled rows (a shorthand or a PolicyLoss; the paper's PPO clip 0.2).
    """

    reads_demonstrations = True

    def __init__(self, gamma: float | None = 0.1, on_policy: PolicyLoss | str = "ppo_clip") -> None:
        from rlvr_lightning.core.losses.policy_losses import policy_loss  # the shorthands name this class too

        if gamma is not None and not gamma > 0.0:
            raise ValueError(f"LUFFY: gamma must be > 0, got {gamma}")
        self.gamma = gamma
        self.on_policy = policy_loss(on_policy, "loss.init_args.on_policy")
        inner = self.on_policy
        if inner.selects_tokens or inner.reads_entropy or inner.reads_reference or inner.reads_demonstrations:
            raise ValueError(
                f"LUFFY: on_policy={type(inner).__name__} reads more than log-probs and advantages; choose a loss "
                "without token selection, entropies, a reference or demonstrations (ppo_clip, ratio, pg, cispo, ...)"
            )

    @property
    def needs_old_log_probs(self) -> bool:
        return self.on_policy.needs_old_log_probs

    def check(self, aggregation: str) -> None:
        self.on_policy.check(aggregation)

    def __call__(self, log_probs, old_log_probs, advantages, mask, demonstration_rows: Tensor | None = None):
        out = self.on_policy(log_probs, old_log_probs, advantages, mask)
        return self._with_demonstrations(out, log_probs, old_log_probs, advantages, mask, demonstration_rows)

    def with_rollout_is(
        self, log_probs, old_log_probs, advantages, mask, weights, demonstration_rows: Tensor | None = None
    ):
        """The sampler's weights correct the sampled rows; a demonstration was not sampled, and keeps its loss."""
        out = self.on_policy.with_rollout_is(log_probs, old_log_probs, advantages, mask, weights)
        return self._with_demonstrations(out, log_probs, old_log_probs, advantages, mask, demonstration_rows)

    def _with_demonstrations(
        self, out: PolicyLossOutput, log_probs, old_log_probs, advantages, mask, demonstration_rows
    ) -> PolicyLossOutput:
        _, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        if demonstration_rows is None:
            demonstration_rows = torch.zeros(log_probs.shape[0], dtype=torch.bool, device=log_probs.device)
        shown = demonstration_rows.to(device=log_probs.device, dtype=torch.bool).unsqueeze(-1)
        probs = torch.exp(log_probs)
        # l_t = -A f(pi_theta(y_t)) on a demonstration's tokens, pi_demonstrator = 1  (LUFFY eq. 6-7)
        off_policy = -adv * policy_shaping(probs, self.gamma)
        out.loss = zero_masked(torch.where(shown, off_policy, out.loss), m)
        for name in ("low_clipped", "high_clipped"):  # no clip acts on a demonstration
            flags = getattr(out, name)
            if flags is not None:
                setattr(out, name, flags & ~shown)
        tokens = shown.expand(log_probs.shape) if m is None else shown & m
        count = tokens.sum().to(log_probs.dtype)
        out.extra_stats["demonstration_prob"] = torch.where(tokens, probs.detach(), 0.0).sum() / count.clamp(min=1)
        out.extra_weights["demonstration_prob"] = count
        return out
