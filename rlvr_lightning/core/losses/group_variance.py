"""`GVPO`: a squared error between each response's centred log-ratio and its centred reward, within its group.

Zhang et al. 2025, "GVPO: Group Variance Policy Optimization for Large Language Model Post-Training"
(arXiv:2504.19599, NeurIPS 2025). The KL-constrained optimum ``pi* ∝ pi' exp(R / beta)`` makes ``beta log(pi* /
pi')`` equal to the reward up to a constant per prompt; GVPO fits the policy to it with a group's responses, where
the constant cancels once both sides are centred:

    loss_i = 1/2 (beta (s_i - mean_g s) - (R_i - mean_g R))^2 / (k - 1),   s_i = sum_t log pi(y_it) - log pi'(y_it)

``pi'``: the policy that sampled the group (the old log-probs); ``R_i - mean_g R``: the response's advantage (a
centred one, ``CenteredAdvantage``); ``k``: the group's size. The group's mean log-ratio is taken without gradient
(the authors' code), and within a group the gradient is that of ``-beta/(k-1) sum_i w_i log pi(y_i)``, ``w_i =
(R_i - mean R) - beta (s_i - mean s)``: no importance ratio and no clip. On the first update ``s = 0`` and GVPO is
centred REINFORCE; on stale data the ``beta (s_i - mean s)`` term pulls back the responses that have moved most.

The loss needs every response of a group in one micro-batch (``reads_groups``): ``update.shuffle: prompts`` and
batch sizes that are multiples of the group's. Without the log-ratio's centring (``center_log_ratio: false``) it is
Kimi k1.5's online mirror descent (Kimi Team 2025, arXiv:2501.12599): ``1/2 (r_i - mean r - tau s_i)^2``, the
partition function's ``tau log Z`` taken as the mean reward, whose gradient ``beta (-(r_i - mean r) + tau s_i) grad
s_i`` is the paper's times ``tau = beta``; it needs no group.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss, PolicyLossOutput, prepare_inputs, token_ratio


def check_whole_groups(group_index: Tensor, group_size: int, what: str) -> None:
    """Raise unless the rows are whole groups of ``group_size`` consecutive rows (as the update deals them with
    ``update.shuffle: prompts``), checked on the device without waiting for it. ``what``: the loss's need, which
    the error names."""
    cut = (
        f"{what} over its {group_size} rows, consecutive in one micro-batch: set update.shuffle: prompts, "
        "update.mini_batch_size and update.micro_batch_size to multiples of the group's rows, and "
        "update.micro_batch_tokens: null"
    )
    if group_size < 1 or group_index.shape[0] % group_size:
        raise ValueError(f"{cut} (this micro-batch holds {group_index.shape[0]} rows)")
    groups = group_index.view(-1, group_size)
    torch._assert_async((groups == groups[:, :1]).all(), cut)  # no host read: a GPU step keeps running ahead


def group_variance_losses(
    log_ratios: Tensor, advantages: Tensor, group_index: Tensor | None, group_size: int, beta: float
) -> tuple[Tensor, Tensor]:
    """Each response's GVPO loss ``[n]`` and its centred log-ratio term ``beta (s_i - mean_g s)`` (detached), from
    its summed log-ratio ``s`` ``[n]`` (differentiable), its advantage ``[n]`` and its group's id ``[n]``: whole
    groups of ``group_size`` consecutive rows (as the update deals them; checked on the device, without waiting for
    it). ``group_index`` None: ``1/2 (beta s_i - A_i)^2``, the
    log-ratio not centred (Kimi k1.5's mirror descent)."""
    scaled = beta * log_ratios
    if group_index is None:
        # 1/2 ((r_i - mean r) - tau log(pi / pi_old)(y_i))^2, tau log Z taken as the mean reward  (Kimi k1.5,
        # arXiv:2501.12599, online mirror descent)
        return 0.5 * (scaled - advantages.to(scaled.dtype)).square(), scaled.detach()
    check_whole_groups(group_index, group_size, "GVPO centres each group's log-ratios")
    means = scaled.detach().view(-1, group_size).mean(-1, keepdim=True)
    centred = (scaled.view(-1, group_size) - means).view(-1)
    # 1/2 (beta (s_i - mean s) - (R_i - mean R))^2 / (k - 1)  (GVPO, arXiv:2504.19599; the authors'
    # compute_policy_loss_gvpo, the group's mean log-ratio without gradient)
    losses = 0.5 * (centred - advantages.to(scaled.dtype)).square() / max(group_size - 1, 1)
    return losses, centred.detach()


class GVPO(PolicyLoss):
    """GVPO's loss (Zhang et al. 2025, arXiv:2504.19599; see the module docstring): each response's squared error
    between ``beta`` times its centred log-ratio to the sampling policy and its centred reward, over its group. A
    response's loss is spread over its tokens (it sums back under ``seq-mean-token-sum``, the mode it needs: the mean
    over responses). Logged: ``gvpo_log_ratio_term``, the mean ``|beta (s_i - mean s)|``.

    Args:
        beta: the KL constraint's weight (the authors' script 0.1).
        center_log_ratio: centre each response's log-ratio over its group (GVPO); False: Kimi k1.5's mirror descent
            (``1/2 (beta s_i - A_i)^2``: the advantage alone centred, by its estimator; no group read).
    """

    def __init__(self, beta: float = 0.1, center_log_ratio: bool = True) -> None:
        if not beta > 0:
            raise ValueError(f"GVPO: beta must be > 0, got {beta}")
        self.beta, self.center_log_ratio = beta, center_log_ratio

    @property
    def reads_groups(self) -> bool:
        return self.center_log_ratio

    def check(self, aggregation: str) -> None:
        if aggregation != "seq-mean-token-sum":
            raise ValueError(
                f"GVPO's loss is one squared error per response, spread over its tokens: it needs aggregation "
                f"seq-mean-token-sum (the mean over responses), not {aggregation!r}"
            )

    def __call__(
        self, log_probs, old_log_probs, advantages, mask, group_index: Tensor | None = None, group_size: int = 0
    ):
        """``group_index`` ``[N]`` and ``group_size``: each row's group and the rows a group has (the update passes
        them; without them every row is a group of its own, which GVPO cannot centre)."""
        if group_index is None and self.center_log_ratio:
            raise ValueError("GVPO needs each row's group (group_index=, group_size=); the update passes them")
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        real = torch.ones_like(log_probs, dtype=torch.bool) if m is None else m
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        log_ratios = torch.where(real, log_probs - old, zero).sum(-1)
        tokens = real.sum(-1).clamp(min=1).to(log_probs.dtype)
        response_advantages = torch.where(real, adv.expand_as(log_probs), zero).sum(-1) / tokens  # as the authors
        losses, term = group_variance_losses(log_ratios, response_advantages, group_index, group_size, self.beta)
        loss = torch.where(real, (losses / tokens).unsqueeze(-1), zero)
        out = PolicyLossOutput(loss, token_ratio(log_probs, old).detach(), m)
        out.extra_stats["gvpo_log_ratio_term"] = term.abs().mean()
        out.extra_weights["gvpo_log_ratio_term"] = log_probs.new_tensor(float(len(term)))
        return out

    def with_rollout_is(self, log_probs, old_log_probs, advantages, mask, weights, **inputs):
        raise ValueError(
            "GVPO uses no importance ratio: its log-ratio term already accounts for the sampling policy; set "
            "rollout_is.mode: null"
        )
