"""`PolicyUpdate`: the inner update of `RLVRModule`, epochs x mini-batches x micro-batches over one rollout.

    for epoch in update.epochs: for mini-batch (shuffled): for micro-batch:
        loss = aggregate(w_IS * policy_loss + kl.coef * KL - entropy_coef * H)   normalised by the mini-batch
               + positive_nll_coef * NLL of the correct responses            by their tokens (VAPO)
        (with a teacher: policy_loss = rl_coef * policy_loss + coef * distillation loss, modules/distillation.py)
        manual_backward(loss)                           DDP all-reduces at the last micro-batch only
    clip the gradient norm; optimizer step (skipped, and counted, when the loss or gradient is not finite)

Its inputs first (`add_old_and_reference_log_probs`): the old log-probs, the trainer's numbers at the weights the
step starts from (recomputed only when the policy moves before the last update or a replay buffer keeps them;
otherwise the first update's own, detached), the reference log-probs and the teacher's. `w_IS` compares the old
log-probs with the sampler's (`rollout_is`), and the loss applies it (`PolicyLoss.with_rollout_is`: each token's
loss times its weight unless the loss says otherwise; the distillation term, token by token); with asynchronous
rollouts the sampler is one update behind: AReaL's decoupled PPO (`modules/async_rollouts.py`).

The module owns one and hands itself to `run` for Lightning's manual optimisation (`optimizers`,
`lr_schedulers`, `manual_backward`, `clip_gradients`). `PPOModule`'s subclass, `ValueUpdate`
(`modules/update/value_update.py`), overrides `policy_forward`, `micro_batch_loss`, `gradient_norm` and
`clip_gradients`.

The loss counts the sampled tokens (`response_mask`), less those of truncated responses with
`aggregation.mask_truncated` and those of prompts whose rewards all agree with `aggregation.mask_zero_variance_groups`
(`modules/update/loss_masks.py`); the scoring forwards read the whole responses either way.

Micro-batches hold `update.micro_batch_size` rows, or with `update.micro_batch_tokens` at most that many tokens
(`micro_batch_rows`): rows grouped by length into balanced micro-batches (`core/packing.py`), as many on every
data-parallel rank, each scored as one padding-free packed sequence. Either way each micro-batch's loss is
normalised by its mini-batch's totals, so the micro-batches' losses add up to the mini-batch's exactly.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import Tensor

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.importance_sampling import mask_off_policy_sequences, rollout_is_weights
from rlvr_lightning.core.kl import kl_estimator
from rlvr_lightning.core.losses.policy_losses import PolicyLoss
from rlvr_lightning.core.losses.positive_example import correct_token_count, positive_example_nll
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.modules.distillation import DistillationConfig, Teacher, distilled_token_loss, score_with_teacher
from rlvr_lightning.modules.options import ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.self_distillation import SelfTeacher
from rlvr_lightning.modules.update.gradients import backward_sync, policy_gradient_norm, report_skipped_update
from rlvr_lightning.modules.update.loss_masks import loss_mask, zero_variance_groups
from rlvr_lightning.modules.update.micro_batches import (
    check_token_budget,
    micro_batch_parts,
    micro_batch_rows,
    micro_batches,
    mini_batch_order,
    pack_sequences,
    scored_in_order,
)
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes, mini_batch_sizes
from rlvr_lightning.modules.update.token_selection import loss_keyword_inputs, mini_batch_selection
from rlvr_lightning.modules.update.update_metrics import MicroBatchLoss, update_metrics
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout


class PolicyUpdate:
    keeps_old_log_probs = False  # True: old log-probs even for one update (a replay buffer stores them)

    def __init__(
        self,
        policy: Policy,
        loss: PolicyLoss,
        aggregation: AggregationConfig,
        kl: KLConfig,
        reference: Policy | None,
        rollout_is: ImportanceSamplingConfig,
        update: UpdateConfig,
        entropy_coef: float,
        sampling: SamplingConfig,
        teacher: Teacher | SelfTeacher | None = None,
        distillation: DistillationConfig = DistillationConfig(),
        positive_nll_coef: float = 0.0,
    ) -> None:
        """
        Args:
            policy: the model being trained.
            loss: the per-token policy loss.
            aggregation: how token losses become the scalar that is back-propagated.
            kl: the KL penalty to `reference`.
            reference: the KL reference (None: no KL).
            rollout_is: the importance-sampling correction of the sampler/trainer mismatch.
            update: epochs, mini- and micro-batch sizes, gradient clipping, non-finite updates tolerated.
            entropy_coef: weight of the entropy bonus subtracted from the per-token loss.
            sampling: how the responses were sampled: log-probs are computed at its temperature.
            teacher: the frozen teacher of on-policy distillation (None: no distillation).
            distillation: the weights of the distillation loss and of the policy loss beside it.
            positive_nll_coef: weight of the NLL of the correct responses (`rollout.correct`), VAPO's LM loss.
        """
        self.policy, self.loss, self.aggregation, self.sampling = policy, loss, aggregation, sampling
        self.temperature = sampling.temperature
        # the divisor of seq-sum-constant: the policy's fixed response length, else the longest response
        response_length = getattr(policy, "response_length", None)
        self.loss_constant = float(aggregation.constant or response_length or sampling.max_new_tokens)
        self.aggregation_args = {"constant": self.loss_constant, "alpha": aggregation.alpha}
        self.kl, self.kl_estimator, self.reference = kl, kl_estimator(kl.estimator), reference
        # a reference without a KL term (a loss that reads it: A*-PO) costs no KL pass
        self.kl_in_loss = reference is not None and kl.coef != 0 and kl.mode == "loss"
        self.rollout_is, self.update, self.entropy_coef = rollout_is, update, entropy_coef
        self.logs_entropy_coef = False  # True when a callback sets entropy_coef each step (AdaptiveEntropyControl)
        self.masks_off_policy = rollout_is.off_policy_mask_threshold is not None
        self.teacher, self.distillation, self.positive_nll_coef = teacher, distillation, positive_nll_coef
        self._hidden: Tensor | None = None  # the last policy forward's hidden states, for a loss that reads them
        self.skipped_updates = 0  # non-finite updates skipped so far
        self.consecutive_skips = 0
        if loss.reads_top_k and teacher is not None and distillation.support_size:
            raise ValueError(
                "a loss that reads the policy's top-K candidates cannot share the forward with a top-k teacher"
            )
        if update.micro_batch_tokens is not None:
            check_token_budget(update.micro_batch_tokens, int(response_length or sampling.max_new_tokens))
            pack_sequences(policy, reference, None if teacher is None else teacher.policy)

    def options(self) -> dict:
        """The arguments this update was built with (a subclass is built from them)."""
        names = ("policy", "loss", "aggregation", "kl", "reference", "rollout_is", "update", "entropy_coef")
        names += ("sampling", "teacher", "distillation", "positive_nll_coef")
        return {name: getattr(self, name) for name in names}

    def micro_batch_rows(self, rollout: Rollout) -> list[Tensor] | list[slice]:
        """The rows of each micro-batch of `rollout` (`modules/update/micro_batches.py`)."""
        return micro_batch_rows(rollout, self.update)

    def micro_batches(self, rollout: Rollout):
        return micro_batches(rollout, self.update)

    def by_micro_batch(self, rollout: Rollout, score) -> Tensor:
        """`score(micro_batch)` (`[n, ...]` per micro-batch) for every row of `rollout`, in its order."""
        return scored_in_order(rollout, micro_batch_parts(rollout, self.update), score)

    # ------------------------------------------------------------------ inputs

    def needs_old_log_probs(self, num_rows: int) -> bool:
        """Old log-probs matter only once the policy has moved, i.e. after the first optimizer step (the
        distillation loss always reads them then, an importance-weighted KL estimator too)."""
        updates = self.update.epochs * (num_rows // (self.update.mini_batch_size or num_rows))
        kl_reads_them = self.kl_in_loss and self.kl_estimator.needs_old_log_probs
        readers = (self.loss.needs_old_log_probs, self.teacher is not None, kl_reads_them, self.masks_off_policy)
        return any(readers) and (updates > 1 or self.keeps_old_log_probs)

    @torch.no_grad()
    def add_old_and_reference_log_probs(self, rollout: Rollout) -> None:
        """Old log-probs (unless the policy already recorded them while sampling) and reference log-probs.

        Sampling log-probs serve as old log-probs only when the policy says they are the trainer's and no
        importance-sampling correction needs the trainer's own numbers next to them."""
        if not self.needs_old_log_probs(rollout.num_rows):
            rollout.old_log_probs = None  # the ratio is 1 by construction: the loss uses detached log-probs
        elif (
            rollout.old_log_probs is None
            and rollout.sampling_log_probs is not None
            and self.policy.sampling_log_probs_exact
            and self.rollout_is.mode is None
        ):
            rollout.old_log_probs = rollout.sampling_log_probs
        elif rollout.old_log_probs is None:
            rollout.old_log_probs = self.by_micro_batch(rollout, self._log_probs)
        if self.reference is not None:
            rollout.ref_log_probs = self.by_micro_batch(
                rollout, lambda mb: self.policy.reference_log_probs(self.reference, mb, self.temperature)
            )
        if self.teacher is not None:
            score_with_teacher(
                self.teacher, self.policy, rollout, self.by_micro_batch, self.temperature, self.distillation
            )

    def _log_probs(self, micro: Rollout) -> Tensor:
        return self.policy.token_log_probs(micro, self.temperature)[0]

    @torch.no_grad()
    def token_kl(self, rollout: Rollout) -> Tensor:
        """`[N, T]` KL estimate to the reference at the sampling policy (no grad)."""
        log_probs = rollout.old_log_probs
        if log_probs is None:
            log_probs = self.by_micro_batch(rollout, self._log_probs)
        return self.kl_estimator.estimate(log_probs, rollout.ref_log_probs, clamp=self.kl.clamp)

    # ------------------------------------------------------------------ the update

    def run(self, rollout: Rollout, module: pl.LightningModule) -> dict[str, Tensor | float]:
        """Train on `rollout` with `module`'s optimizer and scheduler; the step's update metrics."""
        optimizer = module.optimizers()
        scheduler = module.lr_schedulers()
        mini_size = self.update.mini_batch_size or rollout.num_rows
        # Fixed-length responses (every token real) skip all the masking ops of the loss.
        dropped = zero_variance_groups(rollout, self.aggregation)
        masked = not bool(loss_mask(rollout, self.aggregation, dropped).all())
        # casts that the step's no-grad forwards (sampling, old log-probs, values) left in a cached autocast carry
        # no gradient, and torch < 2.11 hands them to the training forwards (pytorch#112583): drop them
        torch.clear_autocast_cache()
        parts: list[MicroBatchLoss] = []
        losses: list[float] = []
        grad_norms: list[float] = []
        for epoch in range(self.update.epochs):
            order = mini_batch_order(rollout, self.update.shuffle) if mini_size < rollout.num_rows else None
            for start in range(0, rollout.num_rows, mini_size):
                minibatch = rollout if order is None else rollout.select(order[start : start + mini_size])
                mini_mask = loss_mask(minibatch, self.aggregation, dropped) if masked else None
                # VAPO's LM loss is normalised by the mini-batch's correct tokens
                sizes = mini_batch_sizes(
                    minibatch, mini_mask, self.aggregation, rollout.num_rows, bool(self.positive_nll_coef)
                )
                micro_losses = []
                micros = list(self.micro_batches(minibatch))
                masks = [loss_mask(micro, self.aggregation, dropped) if masked else None for micro in micros]
                # a token-selecting loss's pick over the whole mini-batch (when it is several micro-batches)
                selections = mini_batch_selection(self.loss, self.selection_forward, micros, masks)
                for i, micro in enumerate(micros):
                    mask = masks[i]
                    first_update = epoch == 0 and start == 0  # the policy is still the one that sampled
                    part = self.micro_batch_loss(micro, mask, sizes, epoch == 0, first_update, selections[i])
                    with backward_sync(module, sync=i == len(micros) - 1):
                        module.manual_backward(part.loss)
                    micro_losses.append(part.loss.detach())
                    parts.append(part)
                loss_sum = micro_losses[0] if len(micro_losses) == 1 else torch.stack(micro_losses).sum()
                loss, grad_norm = self.clip_and_step(module, optimizer, scheduler, loss_sum)
                losses.append(loss)
                grad_norms.append(grad_norm)
        metrics = update_metrics(parts, losses, grad_norms, self.rollout_is.max, rollout.teacher_rows)
        if self.logs_entropy_coef:
            metrics["train/entropy_coef"] = self.entropy_coef
        return metrics

    def micro_batch_loss(
        self,
        micro: Rollout,
        mask: Tensor | None,
        sizes: MiniBatchSizes,
        first_epoch: bool,
        first_update: bool = False,
        selected: Tensor | None = None,
    ) -> MicroBatchLoss:
        """The micro-batch's share of the mini-batch loss, normalised by the mini-batch's `sizes`. `mask`: its
        response mask (None: every token real); `selected`: a token-selecting loss's pick over the mini-batch (None:
        here)."""
        # Entropy is logged from the first epoch (the sampling policy) and costs a pass only where it is needed;
        # as a metric only, without autograd.
        reads_entropy = self.loss.selection_reads_entropy or self.loss.reads_entropy
        with_entropy = first_epoch or self.entropy_coef != 0 or reads_entropy
        support = micro.teacher_top_ids if self.teacher is not None and self.distillation.support_size else None
        if self.loss.reads_top_k:  # the policy's current top-K candidates, from the training forward (SimKO)
            log_probs, entropy, on_support, support = self.policy.top_k_scores(
                micro, self.loss.reads_top_k, self.temperature, with_entropy, self.entropy_coef != 0
            )
        else:
            log_probs, entropy, on_support = self.policy_forward(micro, with_entropy, self.entropy_coef != 0, support)
        hidden, self._hidden = self._hidden, None
        top = (support, on_support) if self.loss.reads_top_k else None
        prompt_state = self.policy.prompt_state(micro) if self.loss.reads_prompt_state else None
        selection = loss_keyword_inputs(self.loss, micro, log_probs, entropy, mask, selected, hidden, top, prompt_state)
        sampled = micro.sampling_log_probs
        sampler_pair = (log_probs.detach(), sampled) if first_update and sampled is not None else None
        weights = self.sampler_weights(micro, log_probs, mask)
        if weights is None:
            policy_loss = self.loss(log_probs, micro.old_log_probs, micro.advantages, mask, **selection)
        else:  # the loss applies the weights (by default each token's loss times its weight)
            inputs = (log_probs, micro.old_log_probs, micro.advantages, mask, weights)
            policy_loss = self.loss.with_rollout_is(*inputs, **selection)
        if self.masks_off_policy:  # the sampler's log-probs, else the old ones, else (on-policy) the current ones
            sampler = next(
                lp for lp in (micro.sampling_log_probs, micro.old_log_probs, log_probs.detach()) if lp is not None
            )
            threshold = self.rollout_is.off_policy_mask_threshold
            mask_off_policy_sequences(policy_loss, micro.advantages, log_probs, sampler, mask, threshold)
        token_loss = policy_loss.loss
        teacher_kl = None
        if self.teacher is not None:
            distilled, taught_kl = distilled_token_loss(log_probs, on_support, micro, mask, self.distillation, weights)
            token_loss = self.distillation.rl_coef * token_loss + self.distillation.coef * distilled
            teacher_kl = taught_kl if first_epoch else None
        kl = None
        if self.kl_in_loss:
            kl = self.token_kl_in_loss(log_probs, micro)
            token_loss = token_loss + self.kl.coef * kl
        if self.entropy_coef != 0:
            token_loss = token_loss - self.entropy_coef * entropy
        loss = aggregate_loss(token_loss, mask, self.aggregation.mode, **self.aggregation_args, **sizes.of_rows(micro))
        positive_nll = None
        num_correct = sizes.num_correct
        if num_correct is not None:
            nll = positive_example_nll(log_probs, micro.correct, mask, num_correct)
            loss = loss + self.positive_nll_coef * nll
            if first_epoch:  # (sum, count) over this micro-batch's correct tokens, for the logged mean
                count = correct_token_count(micro.correct, mask, log_probs.shape[1])
                positive_nll = (nll.detach() * num_correct, count)
        return MicroBatchLoss(
            loss,
            policy_loss,
            mask,
            None if kl is None else kl.detach(),
            entropy.detach() if first_epoch else None,
            sampler_pair,
            teacher_kl,
            positive_nll,
        )

    def sampler_weights(self, micro: Rollout, log_probs: Tensor, mask: Tensor | None) -> Tensor | None:
        """The `rollout_is` importance weights of the sampler/trainer mismatch (None: no correction, or no sampler
        log-probs): the trainer's log-probs at the sampling weights are the recomputed old ones, else this first
        update's."""
        if micro.sampling_log_probs is None or self.rollout_is.mode is None:
            return None
        trainer = micro.old_log_probs if micro.old_log_probs is not None else log_probs.detach()
        options = self.rollout_is
        return rollout_is_weights(trainer, micro.sampling_log_probs, mask, options.mode, options.max, options.min)

    def selection_forward(self, micro: Rollout) -> tuple[Tensor, Tensor | None]:
        """The log-probs (and entropies, if the loss reads them) a token-selecting loss picks from, no autograd."""
        return PolicyUpdate.policy_forward(self, micro, self.loss.selection_reads_entropy, entropy_grad=False)[:2]

    def token_kl_in_loss(self, log_probs: Tensor, micro: Rollout) -> Tensor:
        """`[n, T]` the KL estimate added to the loss (with the old log-probs where the estimator reads them)."""
        if self.kl_estimator.needs_old_log_probs:
            return self.kl_estimator.estimate(log_probs, micro.ref_log_probs, self.kl.clamp, micro.old_log_probs)
        return self.kl_estimator.estimate(log_probs, micro.ref_log_probs, clamp=self.kl.clamp)

    def policy_forward(
        self, micro: Rollout, with_entropy: bool, entropy_grad: bool, support: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The trained log-probs (and entropy) of a micro-batch, and those of the token ids `support` `[n, T, k]`."""
        if support is not None:
            return self.policy.support_log_probs(micro, support, self.temperature, with_entropy, entropy_grad)
        if self.loss.reads_hidden:  # kept for the loss (FlowRL's learned log Z)
            log_probs, entropy, self._hidden = self.policy.token_log_probs_and_hidden(
                micro, self.temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
            )
            return log_probs, entropy, None
        return (*self.policy.token_log_probs(micro, self.temperature, with_entropy, entropy_grad), None)

    # ------------------------------------------------------------------ the optimizer step

    def clip_and_step(self, module: pl.LightningModule, optimizer, scheduler, loss_sum: Tensor) -> tuple[float, float]:
        """Clip and step, or skip the update when the loss or the gradient is not finite. Returns the
        loss and the gradient norm before clipping."""
        grad_norm = self.gradient_norm(loss_sum.device)
        # one host transfer for both numbers: the check is then Python's, not a chain of tensor ops
        loss, grad_norm = torch.stack((loss_sum.to(grad_norm.dtype), grad_norm)).tolist()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.skipped_updates += 1
            self.consecutive_skips += 1
            limit = self.update.max_consecutive_skips
            report_skipped_update(self.policy, loss, grad_norm, self.consecutive_skips, limit)
            optimizer.zero_grad(set_to_none=True)
            return loss, grad_norm
        self.consecutive_skips = 0
        if self.update.max_grad_norm is not None:
            self.clip_gradients(module, optimizer)
        optimizer.step()
        # an autocast opened with its cache (torch's default, Lightning's FSDPPrecision) keeps its casts of the
        # weights until it exits, after training_step: drop them, the next forward must cast the stepped weights
        torch.clear_autocast_cache()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        return loss, grad_norm

    def gradient_norm(self, device: torch.device) -> Tensor:
        """The gradient norm that is logged and must be finite for the update to happen, on `device` (the
        loss's)."""
        return policy_gradient_norm(self.policy, device)

    def clip_gradients(self, module: pl.LightningModule, optimizer) -> None:
        """Clip to `update.max_grad_norm` (Lightning's clipping, which knows the strategy)."""
        module.clip_gradients(optimizer, gradient_clip_val=self.update.max_grad_norm, gradient_clip_algorithm="norm")

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, int]:
        """The skip counters (checkpoints keep them under "rlvr_counters")."""
        return {"skipped_updates": self.skipped_updates, "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped_updates = state.get("skipped_updates", 0)
        self.consecutive_skips = state.get("consecutive_skips", 0)
