"""The inner PPO-style update of `RLVRModule`: epochs x mini-batches x micro-batches over one rollout.

    for epoch in update.epochs: for mini-batch (shuffled): for micro-batch:
        loss = aggregate(w_IS * policy_loss + kl.coef * KL - entropy_coef * H)   normalised by the mini-batch
        manual_backward(loss)                           DDP all-reduces at the last micro-batch only
    clip the gradient norm; optimizer step (skipped, and counted, when the loss or gradient is not finite)

Its inputs first (`_add_old_and_reference_log_probs`): the old log-probs, the trainer's numbers at the
weights the step starts from (recomputed only when the policy moves before the last update; otherwise the
first update's own, detached), and the reference log-probs. `w_IS` compares the old log-probs with the
sampler's (`rollout_is`); with asynchronous rollouts the sampler is one update behind, and the same
arithmetic is AReaL's decoupled PPO (see `modules/async_rollouts.py`).

A mixin: it reads the module's options (`loss`, `aggregation`, `kl`, `rollout_is`, `update`) and
uses Lightning's manual optimisation (`optimizers`, `manual_backward`, `clip_gradients`).
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import torch
from torch import Tensor

from rlvr_lightning.core.aggregation import aggregate_loss, non_empty_rows
from rlvr_lightning.core.importance_sampling import mismatch_stats, rollout_is_weights
from rlvr_lightning.core.masked import join_masked, masked_mean
from rlvr_lightning.core.policy_losses import PolicyLossOutput, merged_stats
from rlvr_lightning.modules.gradients import backward_sync, policy_gradient_norm
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)

class MicroBatchLoss(NamedTuple):
    loss: Tensor  # the scalar that is back-propagated
    policy_loss: PolicyLossOutput
    mask: Tensor | None  # bool [n, T], None: every token counts
    kl: Tensor | None  # detached per-token KL, when it is in the loss
    entropy: Tensor | None  # detached per-token entropy, first epoch only
    sampler_pair: tuple[Tensor, Tensor] | None  # (trainer, sampler) log-probs at the sampling weights, first update only


class PolicyUpdate:
    skipped_updates = 0
    consecutive_skips = 0

    def _micro_batches(self, rollout: Rollout):
        size = self.update.micro_batch_size or self.update.mini_batch_size or rollout.num_rows
        if size >= rollout.num_rows:
            yield rollout
            return
        for start in range(0, rollout.num_rows, size):
            yield rollout.select(slice(start, start + size))

    def _needs_old_log_probs(self, num_rows: int) -> bool:
        """Old log-probs matter only once the policy has moved, i.e. after the first optimizer step."""
        updates = self.update.epochs * (num_rows // (self.update.mini_batch_size or num_rows))
        return self.loss.needs_old_log_probs and updates > 1

    @torch.no_grad()
    def _add_old_and_reference_log_probs(self, rollout: Rollout) -> None:
        """Old log-probs (unless the policy already recorded them while sampling) and reference log-probs.

        Sampling log-probs serve as old log-probs only when the policy says they are the trainer's and no
        importance-sampling correction needs the trainer's own numbers next to them."""
        temperature = self.sampling.temperature
        if not self._needs_old_log_probs(rollout.num_rows):
            rollout.old_log_probs = None  # the ratio is 1 by construction: the loss uses detached log-probs
        elif (
            rollout.old_log_probs is None
            and rollout.sampling_log_probs is not None
            and self.policy.sampling_log_probs_exact
            and self.rollout_is.mode is None
        ):
            rollout.old_log_probs = rollout.sampling_log_probs
        elif rollout.old_log_probs is None:
            rollout.old_log_probs = torch.cat(
                [self.policy.token_log_probs(mb, temperature)[0] for mb in self._micro_batches(rollout)]
            )
        if self.reference is not None:
            rollout.ref_log_probs = torch.cat(
                [self.policy.reference_log_probs(self.reference, mb, temperature) for mb in self._micro_batches(rollout)]
            )

    def _update(self, rollout: Rollout) -> dict[str, Tensor | float]:
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        mini_size = self.update.mini_batch_size or rollout.num_rows
        # Fixed-length responses (every token real) skip all the masking ops of the loss.
        masked = not bool(rollout.response_mask.all())
        parts: list[MicroBatchLoss] = []
        losses: list[float] = []
        grad_norms: list[float] = []
        for epoch in range(self.update.epochs):
            order = torch.randperm(rollout.num_rows, device=rollout.response_ids.device) if mini_size < rollout.num_rows else None
            for start in range(0, rollout.num_rows, mini_size):
                minibatch = rollout if order is None else rollout.select(order[start : start + mini_size])
                num_tokens = minibatch.response_mask.sum() if masked else minibatch.response_mask.numel()
                num_sequences = minibatch.num_rows
                if masked and not self.aggregation.count_empty_rows:
                    num_sequences = non_empty_rows(minibatch.response_mask)
                micro_losses = []
                micros = list(self._micro_batches(minibatch))
                for i, micro in enumerate(micros):
                    mask = micro.response_mask.bool() if masked else None
                    first_update = epoch == 0 and start == 0  # the policy is still the one that sampled
                    part = self._micro_batch_loss(micro, mask, num_sequences, num_tokens, epoch == 0, first_update)
                    with backward_sync(self, sync=i == len(micros) - 1):
                        self.manual_backward(part.loss)
                    micro_losses.append(part.loss.detach())
                    parts.append(part)
                loss_sum = micro_losses[0] if len(micro_losses) == 1 else torch.stack(micro_losses).sum()
                loss, grad_norm = self._clip_and_step(optimizer, scheduler, loss_sum)
                losses.append(loss)
                grad_norms.append(grad_norm)
        return self._update_metrics(parts, losses, grad_norms)

    def _micro_batch_loss(
        self,
        micro: Rollout,
        mask: Tensor | None,
        num_sequences: int,
        num_tokens: Tensor | int,
        first_epoch: bool,
        first_update: bool = False,
    ) -> MicroBatchLoss:
        """The micro-batch's share of the mini-batch loss, normalised by the mini-batch's sizes.

        `mask` is the micro-batch's response mask, or None when every token is real."""
        # Entropy is logged from the first epoch (the sampling policy) and costs a pass only where it is needed;
        # as a metric only, without autograd.
        with_entropy = first_epoch or self.entropy_coef != 0
        log_probs, entropy = self._policy_forward(micro, with_entropy, entropy_grad=self.entropy_coef != 0)
        policy_loss = self.loss(log_probs, micro.old_log_probs, micro.advantages, mask)
        token_loss = policy_loss.loss
        sampler_pair = None
        if micro.sampling_log_probs is not None:
            if first_update:
                sampler_pair = (log_probs.detach(), micro.sampling_log_probs)
            if self.rollout_is.mode is not None:
                # the trainer's log-probs at the sampling weights: the recomputed old ones, else this first update's
                trainer = micro.old_log_probs if micro.old_log_probs is not None else log_probs.detach()
                token_loss = token_loss * rollout_is_weights(
                    trainer, micro.sampling_log_probs, mask, self.rollout_is.mode, self.rollout_is.max, self.rollout_is.min
                )
        kl = None
        if self.reference is not None and self.kl.mode == "loss":
            kl = self.kl_estimator.estimate(log_probs, micro.ref_log_probs, clamp=self.kl.clamp)
            token_loss = token_loss + self.kl.coef * kl
        if self.entropy_coef != 0:
            token_loss = token_loss - self.entropy_coef * entropy
        loss = aggregate_loss(
            token_loss, mask, self.aggregation.mode, num_sequences=num_sequences, num_tokens=num_tokens, constant=self.loss_constant
        )
        return MicroBatchLoss(
            loss,
            policy_loss,
            mask,
            None if kl is None else kl.detach(),
            entropy.detach() if first_epoch else None,
            sampler_pair,
        )

    def _policy_forward(self, micro: Rollout, with_entropy: bool, entropy_grad: bool) -> tuple[Tensor, Tensor | None]:
        """The trained log-probs (and entropy) of a micro-batch. A hook: `PPOModule` reads its value head off
        the same forward."""
        return self.policy.token_log_probs(micro, self.sampling.temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)

    @torch.no_grad()
    def _update_metrics(
        self, parts: list[MicroBatchLoss], losses: list[float], grad_norms: list[float]
    ) -> dict[str, Tensor | float]:
        """The step's update statistics, each computed once over all of its micro-batches (token-weighted)."""
        metrics = {f"train/{key}": value for key, value in merged_stats([part.policy_loss for part in parts]).items()}
        for name in ("kl", "entropy"):
            with_values = [part for part in parts if getattr(part, name) is not None]
            if with_values:
                values, mask = join_masked([getattr(part, name) for part in with_values], [part.mask for part in with_values])
                metrics[f"train/{name}"] = masked_mean(values, mask)
        with_sampler = [part for part in parts if part.sampler_pair is not None]
        if with_sampler:
            trainer, mask = join_masked([part.sampler_pair[0] for part in with_sampler], [part.mask for part in with_sampler])
            sampler, _ = join_masked([part.sampler_pair[1] for part in with_sampler], [part.mask for part in with_sampler])
            stats = mismatch_stats(trainer, sampler, mask, self.rollout_is.max)
            metrics.update({f"train/mismatch/{key}": value for key, value in stats.items()})
        metrics["train/loss"] = sum(losses) / len(losses)
        metrics["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        return metrics

    def _clip_and_step(self, optimizer, scheduler, loss_sum: Tensor) -> tuple[float, float]:
        """Clip and step, or skip the update when the loss or the gradient is not finite. Returns the
        loss and the gradient norm before clipping."""
        grad_norm = self._gradient_norm(loss_sum.device)
        # one host transfer for both numbers: the check is then Python's, not a chain of tensor ops
        loss, grad_norm = torch.stack((loss_sum.to(grad_norm.dtype), grad_norm)).tolist()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            optimizer.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self.consecutive_skips += 1
            log.warning("non-finite loss or gradient: update skipped (%d in a row)", self.consecutive_skips)
            if self.consecutive_skips >= self.update.max_consecutive_skips:
                raise RuntimeError(
                    f"{self.consecutive_skips} consecutive updates had a non-finite loss or gradient "
                    f"(update.max_consecutive_skips={self.update.max_consecutive_skips}); stopping. Lower the learning "
                    "rate, check the rewards for NaN, or raise update.max_consecutive_skips."
                )
            return loss, grad_norm
        self.consecutive_skips = 0
        if self.update.max_grad_norm is not None:
            self._clip_gradients(optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        return loss, grad_norm

    def _gradient_norm(self, device: torch.device) -> Tensor:
        """The gradient norm that is logged and must be finite for the update to happen, on `device` (the
        loss's; a hook)."""
        return policy_gradient_norm(self.policy, device)

    def _clip_gradients(self, optimizer) -> None:
        """Clip to `update.max_grad_norm` (a hook: `PPOModule` clips the policy and the critic separately)."""
        self.clip_gradients(optimizer, gradient_clip_val=self.update.max_grad_norm, gradient_clip_algorithm="norm")

    # ------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rlvr_counters"] = {"skipped_updates": self.skipped_updates, "consecutive_skips": self.consecutive_skips}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        counters = checkpoint.get("rlvr_counters", {})
        self.skipped_updates = counters.get("skipped_updates", 0)
        self.consecutive_skips = counters.get("consecutive_skips", 0)
