"""`RLVRModule`: the GRPO-family training loop (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO, ...).

One `training_step` is one rollout step:

    1. rollout    = policy.sample(prompts, n=group_size)           no grad
    2. rewards    = sum_k w_k * RewardCallback_k(rollout)           trainer.callbacks
    3. advantages = AdvantageCallback.compute(rollout)              trainer.callbacks
    4. old / reference log-probs                                    no grad, only when needed
    5. ppo_epochs x mini-batches x micro-batches:
           loss = aggregate(policy_loss + kl_coef * KL - entropy_coef * H)
           manual_backward per micro-batch; clip; optimizer step per mini-batch

Lightning's `global_step` counts optimizer updates (ppo_epochs x mini-batches per rollout
step); logged metrics are indexed by rollout step. Step 5 lives in `modules/policy_update.py`.
With `rollout_staleness=1`, step 1 takes the rollout sampled during the previous step's update
and the next one is sampled in a background thread meanwhile (`modules/async_rollouts.py`).
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from rlvr_lightning.advantages import AdvantageCallback, GroupNormalizedAdvantage
from rlvr_lightning.core.advantage_estimators import zero_variance_group_fraction
from rlvr_lightning.core.aggregation import AGGREGATION_MODES
from rlvr_lightning.core.importance_sampling import ROLLOUT_IS_MODES
from rlvr_lightning.core.kl import KL_ESTIMATORS, kl_estimate
from rlvr_lightning.core.masked import masked_mean, masked_sum
from rlvr_lightning.core.policy_losses import POLICY_LOSSES
from rlvr_lightning.modules.bias_diagnostics import bias_metrics
from rlvr_lightning.modules.async_rollouts import AsyncRollouts
from rlvr_lightning.modules.dynamic_sampling import keep_informative_groups
from rlvr_lightning.modules.policy_update import PolicyUpdate
from rlvr_lightning.modules.scoring import RewardScoring
from rlvr_lightning.modules.step_metrics import publish_step_metrics
from rlvr_lightning.modules.training_precision import TrainingPrecisionCheck
from rlvr_lightning.parallel.fsdp import ShardedPolicyModule, gathered_params
from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.stage_reports import report_stage
from rlvr_lightning.rewards.base import RewardCallback, find_reward_callbacks
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.timing import clock

log = logging.getLogger(__name__)

KL_MODES = ("loss", "reward")


def _choice(option: str, value: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{option}={value!r} is not valid; choose one of {sorted(choices)}")
    return value


class RLVRModule(TrainingPrecisionCheck, PolicyUpdate, RewardScoring, ShardedPolicyModule, pl.LightningModule):
    #: arguments that are models or factories, not hyperparameters (the checkpoint holds them)
    MODEL_ARGUMENTS: tuple[str, ...] = ("policy", "optimizer", "lr_scheduler")

    def __init__(
        self,
        policy: Policy,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        group_size: int = 8,
        sampling: SamplingConfig | None = None,
        loss: str = "ppo_clip",
        clip_low: float | None = None,
        clip_high: float | None = None,
        dual_clip: float | None = None,
        aggregation: str = "seq-mean-token-mean",
        loss_constant: float | None = None,
        count_empty_rows: bool = True,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        kl_mode: str = "loss",
        kl_clamp: float | None = None,
        ref_update_every: int | None = None,
        ref_mixup_alpha: float = 1.0,
        entropy_coef: float = 0.0,
        rollout_is: str | None = None,
        rollout_is_max: float = 2.0,
        rollout_is_min: float | None = None,
        rollout_staleness: int = 0,
        dynamic_sampling: bool = False,
        max_sampling_rounds: int = 4,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        max_grad_norm: float | None = 1.0,
        max_consecutive_skips: int = 10,
        val_group_size: int = 1,
        val_greedy: bool = True,
    ) -> None:
        """
        Args:
            policy: the model being trained (`ToySortPolicy`, `HFPolicy`, ...).
            group_size: responses sampled per prompt.
            loss: per-token policy loss, one of `core.policy_losses.POLICY_LOSSES`.
            clip_low, clip_high: ratio clip range `[1 - clip_low, 1 + clip_high]`; None keeps the loss's default.
            dual_clip: dual-clip constant for `ppo_clip` (bounds the loss of negative advantages).
            aggregation: how token losses become a scalar, one of `core.aggregation.AGGREGATION_MODES`.
            loss_constant: divisor of `seq-sum-constant` (default: the policy's fixed `response_length` if it has
                one, else `sampling.max_new_tokens`).
            count_empty_rows: whether responses without a token count in the seq-mean modes' divisor (verl: no).
            kl_coef: weight of the KL penalty to the reference policy; 0 means no reference model at all.
            kl_mode: "loss" adds kl_coef * KL to the per-token loss (GRPO); "reward" subtracts kl_coef * sum_t KL_t
                from each response's reward before advantages are computed (PPO-style reward shaping).
            kl_clamp: clamp each token's KL estimate to [-kl_clamp, kl_clamp] (verl's low_var_kl uses 10); k3 overflows
                once the policy is ~88 nats from the reference.
            ref_update_every: refresh the reference from the policy every this many rollout steps (None: never).
            ref_mixup_alpha: the refresh sets ref = alpha * policy + (1 - alpha) * ref (1: copy; < 1: TR-DPO mixup).
            rollout_is: importance-sampling correction of the sampler/trainer mismatch (an inference engine samples),
                one of `core.importance_sampling.ROLLOUT_IS_MODES` (Yao et al. 2025 TIS: `token_truncate`), or None.
                The mismatch itself is logged (`train/mismatch/*`) whenever the policy records sampling log-probs.
            rollout_is_max, rollout_is_min: the weights' cap C (truncate) or the band outside which weights are 0 (mask).
            rollout_staleness: 0: each step samples, then trains (on-policy); 1: the next rollout is sampled in a
                background thread while the current one trains, one update behind (`modules/async_rollouts.py`),
                with AReaL's decoupled PPO loss: `rollout_is` weights pi_old / pi_sampler (None: `token_mask`).
            dynamic_sampling: DAPO's dynamic sampling: drop groups whose rewards all agree and top the batch up
                with fresh prompts, for at most `max_sampling_rounds` generation rounds in all; if the batch is
                still short, it is filled with dropped groups (advantage 0), so every update has the same size.
            mini_batch_size, micro_batch_size: rows (completions) per optimizer step / per backward pass;
                None means the whole rollout / the whole mini-batch.
            max_grad_norm: clip the gradient norm (None: no clipping).
            max_consecutive_skips: stop after this many consecutive updates with a non-finite loss or gradient.
            val_group_size, val_greedy: responses per validation prompt and whether they are decoded greedily.
        """
        super().__init__()
        self.save_hyperparameters(ignore=list(self.MODEL_ARGUMENTS))
        self.automatic_optimization = False
        self.policy = policy
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.sampling = sampling or SamplingConfig()
        self.group_size = group_size
        self.loss = _choice("loss", loss, POLICY_LOSSES)
        self.aggregation = _choice("aggregation", aggregation, AGGREGATION_MODES)
        self.count_empty_rows = count_empty_rows
        self.kl_estimator = _choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
        self.kl_mode = _choice("kl_mode", kl_mode, KL_MODES)
        self.loss_options = {
            k: v for k, v in {"clip_low": clip_low, "clip_high": clip_high, "dual_clip": dual_clip}.items() if v is not None
        }
        if dual_clip is not None and loss != "ppo_clip":
            raise ValueError(f"dual_clip applies to the token-level loss 'ppo_clip', not loss={loss!r}")
        if loss_constant is not None and aggregation != "seq-sum-constant":
            raise ValueError(f"loss_constant is the divisor of aggregation='seq-sum-constant', not of {aggregation!r}")
        self.loss_constant = float(
            loss_constant or getattr(policy, "response_length", None) or self.sampling.max_new_tokens
        )
        if loss in ("pg", "ratio") and (clip_low is not None or clip_high is not None):
            raise ValueError(f"clip_low/clip_high have no effect on loss={loss!r}, which is not clipped; use 'ppo_clip'")
        if kl_mode == "reward" and kl_coef == 0:
            raise ValueError("kl_mode='reward' shapes the reward by kl_coef * KL, but kl_coef=0")
        if not self.sampling.do_sample and group_size > 1:
            raise ValueError(
                f"sampling.do_sample=false decodes greedily: the {group_size} responses of a group would be identical "
                "and every group-relative advantage 0. Sample (do_sample: true) or use group_size: 1."
            )
        if loss == "pg" and ppo_epochs > 1:
            log.warning("loss='pg' has no importance ratio: epochs after the first train on stale samples uncorrected")
        self.kl_clamp = kl_clamp
        if rollout_staleness not in (0, 1):
            raise ValueError(f"rollout_staleness={rollout_staleness!r} is not valid; choose 0 (on-policy) or 1 (one step off-policy)")
        if rollout_staleness and rollout_is is None:
            rollout_is = "token_mask"  # AReaL's decoupled PPO: tokens whose behaviour weight exceeds the cap drop out
        self.rollout_is = None if rollout_is is None else _choice("rollout_is", rollout_is, ROLLOUT_IS_MODES)
        if rollout_is_max <= 0 or (rollout_is_min is not None and not 0 <= rollout_is_min < rollout_is_max):
            raise ValueError(f"need 0 <= rollout_is_min < rollout_is_max, got {rollout_is_min} and {rollout_is_max}")
        self.rollout_is_max = rollout_is_max
        self.rollout_is_min = rollout_is_min
        self.kl_coef = kl_coef
        self.entropy_coef = entropy_coef
        self.ref_update_every = ref_update_every
        if not 0 < ref_mixup_alpha <= 1:
            raise ValueError(f"ref_mixup_alpha must be in (0, 1], got {ref_mixup_alpha}")
        if ref_mixup_alpha != 1 and not ref_update_every:
            raise ValueError("ref_mixup_alpha sets how the reference is refreshed, but ref_update_every is not set")
        if ref_update_every and kl_coef == 0:
            raise ValueError("ref_update_every refreshes the KL reference, but kl_coef=0 means there is no reference")
        self.ref_mixup_alpha = ref_mixup_alpha
        if dynamic_sampling and group_size < 2:
            raise ValueError(
                "dynamic_sampling drops groups whose rewards all agree; with group_size=1 every group agrees "
                "with itself, so nothing could be trained on. Use group_size >= 2."
            )
        if val_greedy and val_group_size > 1:
            raise ValueError(
                f"val_greedy decodes the {val_group_size} validation responses of a prompt identically; "
                "set val_greedy: false to measure pass@k and majority vote"
            )
        if max_sampling_rounds < 1 or (dynamic_sampling and max_sampling_rounds < 2):
            raise ValueError(
                f"max_sampling_rounds={max_sampling_rounds}: dynamic sampling needs >= 2 rounds "
                "(with one it could only reorder the batch)"
            )
        self.dynamic_sampling = dynamic_sampling
        self.max_sampling_rounds = max_sampling_rounds
        self._topup_batches = None
        if loss == "gspo" and aggregation != "seq-mean-token-mean":
            raise ValueError(
                f"loss='gspo' is a sequence-level objective (1/|y_i| per sequence); aggregation={aggregation!r} "
                "would weight sequences by length. Use aggregation='seq-mean-token-mean'."
            )
        if group_size < 1 or ppo_epochs < 1:
            raise ValueError(f"group_size and ppo_epochs must be >= 1, got {group_size} and {ppo_epochs}")
        self.ppo_epochs = ppo_epochs
        if mini_batch_size is not None and micro_batch_size is not None and mini_batch_size % micro_batch_size:
            raise ValueError(
                f"micro_batch_size={micro_batch_size} must divide mini_batch_size={mini_batch_size} "
                "(a mini-batch is accumulated from whole micro-batches)"
            )
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        self.max_consecutive_skips = max_consecutive_skips
        self.val_group_size = val_group_size
        self.val_greedy = val_greedy
        self.reference = policy.create_reference() if kl_coef != 0 else None
        self.reward_callbacks: list[RewardCallback] = []
        self.advantage_estimator: AdvantageCallback | None = None
        self.skipped_updates = 0
        self.consecutive_skips = 0
        self.last_rollout: Rollout | None = None  # the step's trained batch (read by RolloutTableLogger)
        self.rollout_staleness = rollout_staleness
        self.async_rollouts = AsyncRollouts(policy, group_size, self.sampling) if rollout_staleness else None

    # ----------------------------------------------------------------- set-up

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.policy.parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}

    def setup(self, stage: str) -> None:
        callbacks = self.trainer.callbacks
        self.reward_callbacks = find_reward_callbacks(callbacks)
        if not self.reward_callbacks:
            raise ValueError("no RewardCallback in trainer.callbacks: add at least one reward to the config")
        self._setup_advantage_estimator([cb for cb in callbacks if isinstance(cb, AdvantageCallback)])
        self._check_batch_sizes()

    def _setup_advantage_estimator(self, estimators: list[AdvantageCallback]) -> None:
        """Exactly one `AdvantageCallback` (GRPO's when none is configured). A hook: `PPOModule` has its critic."""
        if len(estimators) > 1:
            raise ValueError(
                f"exactly one AdvantageCallback per run, got {len(estimators)}: "
                + ", ".join(type(cb).__name__ for cb in estimators)
            )
        if estimators:
            self.advantage_estimator = estimators[0]
        else:
            self.advantage_estimator = GroupNormalizedAdvantage()
            log.warning("no AdvantageCallback configured: using GRPO's group-normalised advantage")
            if self.trainer.is_global_zero:
                print("rlvr: no AdvantageCallback configured, using GroupNormalizedAdvantage (GRPO)")
        self.advantage_estimator.check_group_size(self.group_size)

    def _check_batch_sizes(self) -> None:
        prompts = getattr(self.trainer.datamodule, "batch_size", None)
        if prompts is None or self.mini_batch_size is None:
            return
        rows = prompts * self.group_size
        if rows % self.mini_batch_size:
            raise ValueError(
                f"mini_batch_size={self.mini_batch_size} must divide the rollout size "
                f"data.batch_size x group_size = {prompts} x {self.group_size} = {rows}"
            )

    # ---------------------------------------------------------- training step

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = clock(self.device)
        self._maybe_update_reference()
        metrics: dict[str, Tensor | float] = {}
        with gathered_params(self.policy):  # sharded (FSDP2): gathered once for all of the step's sampling
            report_stage("generate")
            rollout, generation_stats = self._rollout_to_train(batch, metrics)
            if rollout is None:  # the first step of asynchronous rollouts only samples what the next step trains on
                metrics["time/generation_s"] = metrics["time/step_s"] = clock(self.device) - started
                publish_step_metrics(self, metrics)
                return
            generated = clock(self.device)
            report_stage("score")
            self.score(rollout)
            if self.dynamic_sampling:
                rollout = self._dynamic_sampling(rollout, metrics)
        if self.async_rollouts is not None:  # the next rollout is sampled while this one trains
            metrics["time/weight_push_s"] = self.async_rollouts.launch(batch, self.trainer.global_step)
        scored = clock(self.device)
        metrics.update(self._reward_metrics(rollout, prefix="train", generation_stats=generation_stats))
        metrics.update(bias_metrics(self, rollout))
        report_stage("log-probs")
        self._add_old_and_reference_log_probs(rollout)
        if self.reference is not None and self.kl_mode == "reward":
            self._penalize_reward_with_kl(rollout, metrics)
        rollout.advantages = self._advantages(rollout, metrics)
        self.last_rollout = rollout
        metrics["train/advantage_mean"] = rollout.advantages.mean()
        metrics["train/advantage_std"] = rollout.advantages.std() if rollout.advantages.numel() > 1 else 0.0
        report_stage("update")
        update_stats = self._update(rollout)
        if self.async_rollouts is not None:
            metrics["time/rollout_wait_s"] = self.async_rollouts.wait()  # 0 when sampling took no longer than the update
        finished = clock(self.device)

        metrics.update(update_stats)
        metrics["train/skipped_updates"] = float(self.skipped_updates)
        metrics.setdefault("time/generation_s", generated - started)
        metrics["time/scoring_s"] = scored - generated
        metrics["time/update_s"] = finished - scored
        metrics["time/step_s"] = finished - started
        publish_step_metrics(self, metrics, progress_bar={"reward": "train/reward_mean"})

    def _rollout_to_train(self, batch: PromptBatch, metrics: dict) -> tuple[Rollout | None, dict | None]:
        """The rollout this step trains on and its generation's statistics (None: the policy's last). With
        `rollout_staleness=1` it was sampled during the previous step's update; at the first step there is none
        yet (None): `batch` is sampled for the next step."""
        if self.async_rollouts is None:
            return self.policy.sample(batch, self.group_size, self.sampling), None
        sampled = self.async_rollouts.take(batch, self.trainer.global_step)
        if sampled is None:
            return None, None
        metrics["time/generation_s"] = sampled.stats.pop("sampling_seconds")  # in the background, beside an update
        metrics["train/async/policy_lag"] = float(self.trainer.global_step - sampled.version)  # optimizer steps
        return sampled.rollout, sampled.stats

    def _sample_now(self, batch: PromptBatch) -> Rollout:
        """`batch` sampled now with the current weights (dynamic sampling's top-ups)."""
        if self.async_rollouts is None:
            return self.policy.sample(batch, self.group_size, self.sampling)
        return self.async_rollouts.sample_now(batch, self.trainer.global_step).rollout  # nothing is in flight yet

    def _advantages(self, rollout: Rollout, metrics: dict) -> Tensor:
        """The rollout's advantages (a hook: `PPOModule` estimates them with GAE from its critic)."""
        return self.advantage_estimator.compute(rollout)

    def _dynamic_sampling(self, rollout: Rollout, metrics: dict) -> Rollout:
        def sample_more() -> Rollout:
            report_stage("generate top-up")
            extra = self._sample_now(self._next_topup_batch())
            self.score(extra)
            return extra

        rollout, stats = keep_informative_groups(rollout, sample_more, self.max_sampling_rounds)
        metrics.update({f"train/dynamic_sampling/{key}": value for key, value in stats.items()})
        return rollout

    def _next_topup_batch(self) -> PromptBatch:
        """More prompts from the data module (`RLVRDataModule.topup_batch` is resumable and rank-aware)."""
        datamodule = self.trainer.datamodule
        if hasattr(datamodule, "topup_batch"):
            return datamodule.topup_batch()
        if self._topup_batches is None:  # any other data module: a second pass over its training data
            self._topup_batches = iter(datamodule.train_dataloader())
        try:
            return next(self._topup_batches)
        except StopIteration:
            self._topup_batches = iter(datamodule.train_dataloader())
            return next(self._topup_batches)

    @torch.no_grad()
    def _token_kl(self, rollout: Rollout) -> Tensor:
        """`[N, T]` KL estimate to the reference at the sampling policy (no grad)."""
        log_probs = rollout.old_log_probs
        if log_probs is None:
            log_probs = torch.cat([self.policy.token_log_probs(mb, self.sampling.temperature)[0] for mb in self._micro_batches(rollout)])
        return kl_estimate(log_probs, rollout.ref_log_probs, self.kl_estimator, clamp=self.kl_clamp)

    @torch.no_grad()
    def _penalize_reward_with_kl(self, rollout: Rollout, metrics: dict) -> None:
        """reward_i -= kl_coef * sum_t KL_t (PPO-style KL reward shaping; Ouyang et al. 2022 eq. 2)."""
        kl = self._token_kl(rollout)
        penalty = self.kl_coef * masked_sum(kl, rollout.response_mask, dim=-1)
        rollout.reward = rollout.reward - penalty
        metrics["train/kl_reward_penalty"] = penalty.mean()
        metrics["train/kl"] = masked_mean(kl, rollout.response_mask)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.async_rollouts is not None:  # the rollout sampled during the last update, which the next step trains on
            checkpoint["rlvr_async_rollouts"] = self.async_rollouts.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        ready = checkpoint.get("rlvr_async_rollouts", {}).get("ready")
        if self.async_rollouts is not None and "rlvr_async_rollouts" in checkpoint:
            self.async_rollouts.load_state_dict(checkpoint["rlvr_async_rollouts"])
        elif ready is not None:
            log.warning("the checkpoint holds a rollout sampled for rollout_staleness=1; this run samples on-policy without it")

    def teardown(self, stage: str) -> None:
        if self.async_rollouts is not None:
            self.async_rollouts.close()

    @property
    def rollout_step(self) -> int:
        """Rollout steps completed so far (Lightning's logging step; restored from checkpoints)."""
        return self.trainer.fit_loop.epoch_loop._batches_that_stepped

    def _maybe_update_reference(self) -> None:
        if self.reference is None or not self.ref_update_every:
            return
        if self.rollout_step > 0 and self.rollout_step % self.ref_update_every == 0:
            self.policy.update_reference(self.reference, alpha=self.ref_mixup_alpha)

    # ---------------------------------------------------------------- metrics

    def _reward_metrics(self, rollout: Rollout, prefix: str, generation_stats: dict | None = None) -> dict[str, Tensor | float]:
        reward = rollout.reward
        metrics: dict[str, Tensor | float] = {
            f"{prefix}/reward_mean": reward.mean(),
            f"{prefix}/reward_std": reward.std() if reward.numel() > 1 else 0.0,
            f"{prefix}/reward_min": reward.min(),
            f"{prefix}/reward_max": reward.max(),
            f"{prefix}/zero_variance_groups": zero_variance_group_fraction(reward, rollout.group_size),
        }
        metrics.update(self.per_reward_metrics(rollout, prefix))
        stats = generation_stats if generation_stats is not None else getattr(self.policy, "last_generation_stats", None)
        if stats:
            metrics.update({f"{prefix}/generation/{key}": float(value) for key, value in stats.items()})
        return metrics
