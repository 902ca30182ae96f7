"""`ValueUpdate`: `PPOModule`'s inner update, `PolicyUpdate`'s loop with the critic trained beside the policy.

    loss = policy loss + value.coef * value loss (clipped around V_old)               core/losses/value_loss.py
    a shared value head reads the hidden states of the policy's own forward
    gradient norms: the policy's is logged and checked; the critic's must be finite too, and each model is
    clipped to update.max_grad_norm on its own (as verl clips actor and critic)

During the critic's warm-up (`warming_up`, set by the module each rollout step) the policy loss is dropped
and a shared trunk is read detached, so the policy's parameters get no gradient at all.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from torch import Tensor

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.value_loss import value_loss
from rlvr_lightning.core.masked import join_masked, masked_mean
from rlvr_lightning.modules.ppo_options import ValueConfig
from rlvr_lightning.modules.update.gradients import total_norm
from rlvr_lightning.modules.update.micro_batches import pack_sequences
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.modules.update.update_metrics import MicroBatchLoss
from rlvr_lightning.modules.value_model import ValueHead
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout


class _ValuePart(NamedTuple):
    loss: Tensor  # the micro-batch's share of its mini-batch's value loss (detached)
    clipped: Tensor  # bool [n, T]
    mask: Tensor | None


class ValueUpdate(PolicyUpdate):
    def __init__(self, critic: Policy | None, value_head: ValueHead, value: ValueConfig, **options: Any) -> None:
        """
        Args:
            critic: the separate value model's trunk (None: the value head reads the policy's hidden states).
            value_head: the linear value head on the trunk's hidden states.
            value: the value loss's options (coef, clip).
            **options: `PolicyUpdate`'s arguments.
        """
        super().__init__(**options)
        if critic is None and ((self.teacher is not None and self.distillation.support_size) or self.loss.reads_top_k):
            raise ValueError(
                "distillation.mode=topk_logits (or a loss reading the policy's top-K, SimKO) scores a top-k support "
                "with the policy's forward, which value.model=shared reads for its hidden states: use "
                "value.model=separate (or mode sampled_token)"
            )
        self.critic, self.value_head, self.value = critic, value_head, value
        if self.update.micro_batch_tokens is not None:
            pack_sequences(critic)
        self.warming_up = False  # this rollout step trains the critic only
        self._shared_hidden: Tensor | None = None  # the policy forward's hidden states, read by the value loss
        self._value_parts: list[_ValuePart] = []
        self._critic_grad_norms: list[Tensor] = []

    def critic_parameters(self) -> list[torch.nn.Parameter]:
        """The value head's parameters and, for a separate value model, its trunk's."""
        trunk = [] if self.critic is None else list(self.critic.parameters())
        return [*self.value_head.parameters(), *trunk]

    def values(self, micro: Rollout, hidden: Tensor | None = None) -> Tensor:
        """`[n, T]` values of a micro-batch, 0 on masked positions (`hidden`: the policy forward's, when shared)."""
        if hidden is None:
            trunk = self.critic if self.critic is not None else self.policy
            hidden = trunk.response_hidden_states(micro)
        values = self.value_head(hidden)
        return values * micro.response_mask.to(values.dtype)

    def run(self, rollout: Rollout, module: pl.LightningModule) -> dict[str, Tensor | float]:
        self._value_parts, self._critic_grad_norms = [], []
        metrics = super().run(rollout, module)
        parts, norms = self._value_parts, self._critic_grad_norms
        clipped, mask = join_masked([p.clipped for p in parts], [p.mask for p in parts])
        # the micro-batch losses of a mini-batch add up to its loss; averaged over the optimizer steps
        metrics["train/critic/value_loss"] = torch.stack([p.loss for p in parts]).sum() / max(len(norms), 1)
        metrics["train/critic/clip_frac"] = masked_mean(clipped.float(), mask)
        metrics["train/critic/grad_norm"] = torch.stack(norms).mean() if norms else 0.0
        return metrics

    def policy_forward(
        self, micro: Rollout, with_entropy: bool, entropy_grad: bool, support: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if self.critic is not None:
            return super().policy_forward(micro, with_entropy, entropy_grad, support)
        log_probs, entropy, self._shared_hidden = self.policy.token_log_probs_and_hidden(
            micro, self.temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
        self._hidden = self._shared_hidden if self.loss.reads_hidden else None  # the policy loss may read them too
        return log_probs, entropy, None

    def micro_batch_loss(
        self,
        micro: Rollout,
        mask: Tensor | None,
        sizes: MiniBatchSizes,
        first_epoch: bool,
        first_update: bool = False,
        selected: Tensor | None = None,
    ) -> MicroBatchLoss:
        part = super().micro_batch_loss(micro, mask, sizes, first_epoch, first_update, selected)
        hidden, self._shared_hidden = self._shared_hidden, None
        if hidden is not None and self.warming_up:
            hidden = hidden.detach()  # the policy's trunk stays where it is during the warm-up
        values = self.values(micro, hidden)
        out = value_loss(values, micro.values, micro.returns, mask, self.value.clip)
        # token-mean over the mini-batch (verl's critic loss_agg_mode), normalised by the mini-batch's tokens
        critic_loss = aggregate_loss(out.loss, mask, "token-mean", num_tokens=sizes.num_tokens)
        self._value_parts.append(_ValuePart(critic_loss.detach(), out.clipped, mask))
        if self.warming_up:
            return part._replace(loss=self.value.coef * critic_loss)
        return part._replace(loss=part.loss + self.value.coef * critic_loss)

    def gradient_norm(self, device: torch.device) -> Tensor:
        """The policy's gradient norm (logged as train/grad_norm); NaN when the critic's is not finite, so that
        the update is skipped as for a non-finite policy gradient. During the warm-up the policy has no gradient:
        its norm is a 0 on `device` too."""
        policy = super().gradient_norm(device)
        critic = total_norm([p.grad for p in self.critic_parameters() if p.grad is not None], device)
        self._critic_grad_norms.append(critic)
        return torch.where(torch.isfinite(critic), policy, critic)

    def clip_gradients(self, module: pl.LightningModule, optimizer) -> None:
        # each model on its own: one joint norm would let a large value loss shrink the policy's step (verl clips
        # actor and critic separately)
        for params in (self.policy.parameters(), self.critic_parameters()):
            grads = [p for p in params if p.grad is not None]
            if grads:
                torch.nn.utils.clip_grad_norm_(grads, self.update.max_grad_norm)
