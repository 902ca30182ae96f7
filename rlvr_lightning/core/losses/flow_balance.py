"""`FlowRL`: the policy fitted to the reward-weighted reference by a trajectory-balance squared error.

Zhu et al. 2025, "FlowRL: Matching Reward Distributions for LLM Reasoning" (arXiv:2509.15207). The target
distribution is ``pi_ref(y|x) exp(beta r(x, y)) / Z(x)``; FlowRL fits the policy to it with GFlowNets' trajectory
balance, length-normalised, importance-weighted and with the group-normalised reward (an advantage ``A``):

    loss_i = w_i (log Z(x) + 1/|y_i| log pi(y_i|x) - beta A_i - 1/|y_i| log pi_ref(y_i|x))^2
    w_i    = clip(pi(y_i|x) / pi_old(y_i|x), 1 - clip_low, 1 + clip_high), without gradient

(``A_i``: the response's advantage averaged over its tokens, as the authors' code takes it.) ``log Z(x)``:

* ``log_z: group`` (default): for each prompt, the value that minimises the loss over its group, the ``w``-weighted
  mean of ``beta A_i - 1/|y_i| log(pi / pi_ref)(y_i)``, taken without gradient (the batch estimate of VarGrad,
  Richter et al. 2020, which Trajectory Balance with Asynchrony, Bartoldson et al. 2025, arXiv:2503.18929, uses
  for LLM post-training). It is the learned ``log Z``'s own target, nothing is trained beside the policy, and the
  gradient is the same with or without it detached (the loss is at its minimum in ``log Z``). Each response's
  residual then compares its length-normalised log-ratio to the reference, centred over its group, with ``beta``
  times its centred advantage. Every response of a group must be in one micro-batch (``reads_groups``:
  ``update.shuffle: prompts``).
* ``log_z: learned``: the paper's, a network ``Z_phi`` (``PartitionHead``: ``z_layers - 1`` blocks of Linear, GELU,
  LayerNorm and dropout, then a Linear to one number, the authors' ``ProjZModule``) trained with the policy by the
  same loss. It reads (``z_input``) ``prompt``, the policy's summary of the prompt, ``Policy.prompt_state`` (a
  language model's: the mean of its last hidden states over the prompt's tokens but its last, as the authors' code
  takes it; one forward over the prompts more per micro-batch), or ``response_start``, the policy's last hidden state
  at the prompt's last token (the state the response's first token is drawn from, from the scoring forward itself).
  Either way the loss's gradient reaches the policy through that state too, as in the authors' code.

The loss reads the reference's log-probs (``reads_reference``: the module keeps a frozen reference). One number per
response, spread over its tokens: ``seq-mean-token-mean`` gives the mean over responses, the authors' ``torch.mean``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlvr_lightning.core.losses.group_variance import check_whole_groups
from rlvr_lightning.core.losses.policy_loss_base import (
    LOG_RATIO_CLAMP,
    PolicyLoss,
    PolicyLossOutput,
    check_choice,
    check_clip,
    prepare_inputs,
)

#: the aggregations FlowRL accepts: each response's squared error counts once
FLOWRL_AGGREGATIONS = ("seq-mean-token-mean",)
#: where log Z comes from: each group's minimiser, or a network trained with the policy
LOG_Z_SOURCES = ("group", "learned")
#: what the learned log Z reads: the policy's summary of the prompt, or its state at the first response position
Z_INPUTS = ("prompt", "response_start")


class PartitionHead(nn.Module):
    """``log Z_phi(x)`` from a hidden state ``[..., H]``: ``layers - 1`` blocks of Linear(H, H), GELU, LayerNorm and
    Dropout, then Linear(H, 1) (FlowRL's ``ProjZModule``, verl's recipe/flowrl), in float32 whatever the trunk's
    dtype."""

    def __init__(self, hidden_size: int, layers: int = 3, dropout: float = 0.1) -> None:
        super().__init__()
        blocks = []
        for _ in range(layers - 1):
            blocks += [nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size), nn.Dropout(dropout)]
        self.net = nn.Sequential(*blocks, nn.Linear(hidden_size, 1))

    def forward(self, hidden: Tensor) -> Tensor:
        """``[...]`` log Z from hidden states ``[..., H]``."""
        return self.net(hidden.to(self.net[-1].weight.dtype)).squeeze(-1)


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
        clip_low: the trajectory weight's clip below, ``1 - clip_low`` (the authors' recipe in verl: 0.2).
        clip_high: the trajectory weight's clip above, ``1 + clip_high`` (the authors' recipe in verl: 0.28).
        log_z: ``group`` (each group's minimiser) or ``learned`` (the paper's ``PartitionHead``).
        z_layers: the learned head's layers (the authors' 3).
        z_dropout: the learned head's dropout (the authors' 0.1).
        z_input: what the learned head reads: ``prompt`` (``Policy.prompt_state``, the authors') or
            ``response_start`` (the hidden state the response's first token is drawn from).
    """

    reads_reference = True

    def __init__(
        self,
        beta: float = 15.0,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        log_z: str = "group",
        z_layers: int = 3,
        z_dropout: float = 0.1,
        z_input: str = "prompt",
    ) -> None:
        if not beta > 0:
            raise ValueError(f"FlowRL: beta must be > 0, got {beta}")
        check_clip("FlowRL", "clip_low", clip_low)
        check_clip("FlowRL", "clip_high", clip_high)
        if clip_low >= 1:
            raise ValueError(f"FlowRL: clip_low must be < 1 (the weight's lower bound 1 - clip_low), got {clip_low}")
        check_choice("FlowRL", "log_z", log_z, LOG_Z_SOURCES)
        check_choice("FlowRL", "z_input", z_input, Z_INPUTS)
        if z_layers < 1 or not 0 <= z_dropout < 1:
            raise ValueError(f"FlowRL: z_layers must be >= 1 and z_dropout in [0, 1), got {z_layers}, {z_dropout}")
        self.beta, self.clip_low, self.clip_high = beta, clip_low, clip_high
        self.log_z, self.z_layers, self.z_dropout, self.z_input = log_z, z_layers, z_dropout, z_input
        self._head: PartitionHead | None = None

    @property
    def reads_groups(self) -> bool:
        return self.log_z == "group"

    @property
    def reads_hidden(self) -> bool:
        return self.log_z == "learned" and self.z_input == "response_start"

    @property
    def reads_prompt_state(self) -> bool:
        return self.log_z == "learned" and self.z_input == "prompt"

    def attach(self, policy) -> nn.Module | None:
        """The learned ``log Z``'s head, on the policy's hidden states (``log_z: learned``; None otherwise)."""
        if self.log_z != "learned":
            return None
        try:
            hidden_size = policy.hidden_size
        except NotImplementedError as error:
            raise ValueError(f"FlowRL's log_z: learned reads the policy's hidden states: {error}") from None
        self._head = PartitionHead(hidden_size, self.z_layers, self.z_dropout)
        return self._head

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
        hidden: Tensor | None = None,
        prompt_state: Tensor | None = None,
    ):
        """``ref_log_probs`` ``[N, T]``, and ``group_index`` ``[N]`` with ``group_size`` (``log_z: group``), or the
        policy's ``prompt_state`` ``[N, H]`` or ``hidden`` states ``[N, T, H]`` (``log_z: learned``, by
        ``z_input``): the update passes them."""
        learned = self.log_z == "learned"
        state = (prompt_state if self.z_input == "prompt" else hidden) if learned else group_index
        if ref_log_probs is None or state is None:
            needs = f"the policy's {self.z_input} state (log_z: learned)" if learned else "each row's group"
            raise ValueError(f"FlowRL needs the reference's log-probs and {needs}; the update passes them")
        if learned and self._head is None:
            raise ValueError("FlowRL's log_z: learned builds its head in attach(policy); the module calls it")
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
        # delta = log Z + 1/|y| log pi - beta A - 1/|y| log pi_ref; loss = w delta^2  (FlowRL, arXiv:2509.15207;
        # the authors' compute_flowrl_objective in verl's recipe/flowrl)
        residual = response_mean(log_probs) - self.beta * response_mean(adv) - response_mean(ref_log_probs)
        if learned:  # Z_phi on the prompt's summary, or on the state the first response token is drawn from
            log_z = self._head(state if self.z_input == "prompt" else state[:, 0]).to(residual.dtype)
        else:
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
        for name, value in (("log_z", log_z.detach()), ("weight", weight), ("residual", delta.detach().abs())):
            out.extra_stats[f"flowrl_{name}"] = value.mean()
            out.extra_weights[f"flowrl_{name}"] = rows
        return out
