"""`FlowRL`: the policy fitted to the reward-weighted reference by a trajectory-balance squared error.

Zhu et al. 2025, "FlowRL: Matching Reward Distributions for LLM Reasoning" (arXiv:2509.15207). The target
distribution is ``pi_ref(y|x) exp(beta r(x, y)) / Z(x)``; FlowRL fits the policy to it with GFlowNets' trajectory
balance, length-normalised, importance-weighted and with the group-normalised reward (an advantage ``A``):

    loss_i = w_i (log Z(x) + 1/|y_i| log pi(y_i|x) - beta A_i - 1/|y_i| log pi_ref(y_i|x))^2
    w_i    = clip(pi(y_i|x) / pi_old(y_i|x), 1 - clip_low, 1 + clip_high), without gradient

(``A_i``: the response's advantage averaged over its tokens, as the authors' code takes it.) The paper learns
``log Z(x)`` with a small network on the prompt's hidden states. Here ``log Z`` is, for each prompt, the value that
minimises the loss over its group: the ``w``-weighted mean of ``beta A_i - 1/|y_i| log(pi / pi_ref)(y_i)``, taken
without gradient (the batch estimate of VarGrad, Richter et al. 2020, which Trajectory Balance with Asynchrony,
Bartoldson et al. 2025, arXiv:2503.18929, uses for LLM post-training). It is the learned ``log Z``'s own target, so
nothing is trained beside the policy, and the gradient is the same with or without it detached (the loss is at its
minimum in ``log Z``). Each response's residual then compares its length-normalised log-ratio to the reference,
centred over its group, with ``beta`` times its centred advantage.

The loss needs every response of a group in one micro-batch (``reads_groups``: ``update.shuffle: prompts``) and the
reference's log-probs (``reads_reference``: the module keeps a frozen reference). One number per response, spread
over its tokens: ``seq-mean-token-mean`` gives the mean over responses, the authors' ``torch.mean``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlvr_lightning.core.losses.group_variance import check_whole_groups
from rlvr_lightning.core.losses.policy_loss_base import (
    LOG_RATIO_CLAMP,
    PolicyLoss,
    PolicyLossOutput,
    check_clip,
    prepare_inputs,
)

#: the aggregations FlowRL accepts: each response's squared error counts once
FLOWRL_AGGREGATIONS = ("seq-mean-token-mean",)


def group_log_partition(residuals: Tensor, weights: Tensor, group_index: Tensor, group_size: int) -> Tensor:
    """``[n]`` each row's group estimate of ``log Z``: ``-sum_i w_i c_i / sum_i w_i`` over its group, the minimiser of
    ``sum_i w_i (log Z + c_i)^2``, from the residuals without ``log Z`` ``c`` ``[n]`` (detached) and the weights
    ``[n]`` (0 for a row that must not count, e.g. an empty response). Rows are whole consecutive groups."""
    check_whole_groups(group_index, group_size, "FlowRL estimates each group's log Z")
    c, w = residuals.view(-1, group_size), weights.view(-1, group_size)
    log_z = -(w * c).sum(-1, keepdim=True) / w.sum(-1, keepdim=True).clamp(min=torch.finfo(c.dtype).tiny)
    return log_z.expand_as(c).reshape(-1)


class FlowRL(PolicyLoss):
    """FlowRL's trajectory-balance loss (Zhu et al. 2025, arXiv:2509.15207; see the module docstring), with each
    group's ``log Z`` estimated from the group. Logged: ``flowrl_log_z`` (the mean ``log Z``), ``flowrl_weight``
    (the mean clipped trajectory weight) and ``flowrl_residual`` (the mean ``|delta|``, the square root's scale of
    the loss); ``ratio_*`` and ``clip_frac_*`` describe the trajectory weight before and where it is clipped.

    Args:
        beta: the reward's inverse temperature in the target ``pi_ref exp(beta A)`` (the paper's 15).
        clip_low, clip_high: the trajectory weight's clip ``[1 - clip_low, 1 + clip_high]`` (the authors' recipe in
            verl: 0.2 and 0.28).
    """

    reads_reference = True
    reads_groups = True

    def __init__(self, beta: float = 15.0, clip_low: float = 0.2, clip_high: float = 0.28) -> None:
        if not beta > 0:
            raise ValueError(f"FlowRL: beta must be > 0, got {beta}")
        check_clip("FlowRL", "clip_low", clip_low)
        check_clip("FlowRL", "clip_high", clip_high)
        if clip_low >= 1:
            raise ValueError(f"FlowRL: clip_low must be < 1 (the weight's lower bound 1 - clip_low), got {clip_low}")
        self.beta, self.clip_low, self.clip_high = beta, clip_low, clip_high

    def check(self, aggregation: str) -> None:
        if aggregation not in FLOWRL_AGGREGATIONS:
            raise ValueError(
                f"FlowRL's loss is one squared error per response; aggregation.mode={aggregation!r} would weigh "
                f"responses by their length. Use aggregation: {{mode: {FLOWRL_AGGREGATIONS[0]}}}."
            )

    def __call__(
        self,
        log_probs,
        old_log_probs,
        advantages,
        mask,
        ref_log_probs: Tensor | None = None,
        group_index: Tensor | None = None,
        group_size: int = 0,
    ):
        """``ref_log_probs`` ``[N, T]``, ``group_index`` ``[N]`` and ``group_size``: the update passes them."""
        if ref_log_probs is None or group_index is None:
            raise ValueError("FlowRL needs the reference's log-probs and each row's group; the update passes them")
        old, adv, m = prepare_inputs(log_probs, old_log_probs, advantages, mask)
        real = torch.ones_like(log_probs, dtype=torch.bool) if m is None else m
        zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
        tokens = real.sum(-1)
        per_token = tokens.clamp(min=1).to(log_probs.dtype)

        def response_mean(values: Tensor) -> Tensor:
            return torch.where(real, values.to(log_probs.dtype).expand_as(log_probs), zero).sum(-1) / per_token

        log_w = torch.where(real, log_probs.detach() - old, zero).sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        raw = log_w.exp()
        weight = raw.clamp(1 - self.clip_low, 1 + self.clip_high)
        # delta = log Z + 1/|y| log pi - beta A - 1/|y| log pi_ref; loss = w delta^2  (FlowRL, arXiv:2509.15207 eq. 9;
        # the authors' compute_flowrl_objective in verl's recipe/flowrl)
        residual = response_mean(log_probs) - self.beta * response_mean(adv) - response_mean(ref_log_probs)
        counts = torch.where(tokens > 0, weight, zero)  # an empty response has no residual to balance
        log_z = group_log_partition(residual.detach(), counts, group_index, group_size)
        delta = log_z + residual
        loss = torch.where(real, (weight * delta.square()).unsqueeze(-1), zero)
        out = PolicyLossOutput(
            loss,
            raw.unsqueeze(-1).expand_as(log_probs),
            m,
            low_clipped=(raw < 1 - self.clip_low).unsqueeze(-1).expand_as(real),
            high_clipped=(raw > 1 + self.clip_high).unsqueeze(-1).expand_as(real),
        )
        rows = log_probs.new_tensor(float(len(delta)))
        for name, value in (("log_z", log_z), ("weight", weight), ("residual", delta.detach().abs())):
            out.extra_stats[f"flowrl_{name}"] = value.mean()
            out.extra_weights[f"flowrl_{name}"] = rows
        return out
