"""`RLVRModule`: the GRPO-family training loop (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO, ...).

One `training_step` is one rollout step:

    1. rollout    = policy.sample(prompts, n=group_size)           no grad
    2. rewards    = sum_k w_k * RewardCallback_k(rollout)           trainer.callbacks
    3. advantages = AdvantageCallback.compute(rollout)              trainer.callbacks
    4. old / reference log-probs                                    no grad, only when needed
    5. update.epochs x mini-batches x micro-batches:
           loss = aggregate(policy_loss + kl.coef * KL - entropy_coef * H)
           manual_backward per micro-batch; clip; optimizer step per mini-batch

With a `teacher`, step 4 also scores the rollout with it and the policy loss is mixed with the on-policy
distillation loss (`modules/distillation.py`).

Lightning's `global_step` counts optimizer updates (update.epochs x mini-batches per rollout
step); logged metrics are indexed by rollout step. Steps 4 and 5 are the module's `PolicyUpdate`
(`modules/update/policy_update.py`).
With `rollout_staleness=1`, step 1 takes the rollout sampled during the previous step's update
and the next one is sampled in a background thread meanwhile (`modules/async_rollouts.py`); with K >= 2 the
rollouts wait in a queue and each is trained on K updates after the weights it was sampled with.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from rlvr_lightning.advantages import AdvantageCallback
from rlvr_lightning.core import PolicyLoss, masked_mean, masked_sum, policy_loss, token_energy_from_logits
from rlvr_lightning.data.retire_solved import retire_solved_prompts
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.advantage_choice import choose_advantage_estimator
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.modules.async_rollouts import AsyncRollouts
from rlvr_lightning.modules.bias_metrics import bias_metrics
from rlvr_lightning.modules.demonstrations import (
    DemonstrationConfig,
    add_demonstrations,
    check_demonstrations,
    check_first_demonstration,
    demonstration_metrics,
)
from rlvr_lightning.modules.distillation import DistillationConfig, check_distillation, make_teacher
from rlvr_lightning.modules.dynamic_sampling import TopUpPrompts, keep_informative_groups
from rlvr_lightning.modules.group_filter import GroupFilterConfig, filter_groups
from rlvr_lightning.modules.options import (
    DynamicSamplingConfig,
    ImportanceSamplingConfig,
    KLConfig,
    ReplayConfig,
    UpdateConfig,
    ValidationConfig,
    check_option_groups,
    check_rollout_staleness,
    plain_hyperparameters,
)
from rlvr_lightning.modules.policy_module import PolicyModule
from rlvr_lightning.modules.reference_refresh import refresh_reference
from rlvr_lightning.modules.replay_buffer import load_ranks_state_dict, ranks_state_dict, replay_buffer
from rlvr_lightning.modules.scoring import correct_rows, reward_metrics
from rlvr_lightning.modules.self_distillation import SelfTeacher
from rlvr_lightning.modules.step_metrics import publish_step_metrics
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.parallel.fsdp import gathered_params
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.global_random import GLOBAL_RANDOM_LOCK
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, POSITIVE_INT
from rlvr_lightning.runtime.stage_reports import report_stage
from rlvr_lightning.runtime.timing import clock

log = logging.getLogger(__name__)


@documented_options
class RLVRModule(PolicyModule):
    #: arguments that are models or factories, not hyperparameters (the checkpoint holds them)
    MODEL_ARGUMENTS: tuple[str, ...] = ("policy", "optimizer", "lr_scheduler", "teacher")
    reports_pass_rates = True  # each step's rollout goes to `retire_solved_prompts` (data.retire_solved)

    def __init__(
        self,
        policy: Annotated[Policy, Option("the model being trained (ToySortPolicy, HFPolicy, ...).")],
        optimizer: Annotated[OptimizerCallable, Option("the optimizer (class_path, init_args); default Adam.")] = (
            torch.optim.Adam
        ),
        lr_scheduler: Annotated[LRSchedulerCallable | None, Option("stepped at every optimizer step.")] = None,
        group_size: Annotated[int, Option("responses sampled per prompt.", POSITIVE_INT)] = 8,
        sampling: Annotated[SamplingConfig | None, Option("how responses are sampled; log-probs use it too.")] = None,
        loss: Annotated[
            PolicyLoss | str,
            Option(
                "the per-token policy loss: pg | ratio | ppo_clip | gspo | cispo | sapo | luspo | vespo | gmpo | "
                "dppo | clip_cov | kl_cov | topr | gppo | high_entropy | entropy_shaped | astar_po | luffy | m2po | "
                "dynamic_clip | bapo | gvpo | archer | aspo | flowrl | simko, or a PolicyLoss by class_path "
                "(e.g. ...core.PPOClip)."
            ),
        ] = "ppo_clip",
        aggregation: Annotated[AggregationConfig, Option("token losses to the scalar.")] = AggregationConfig(),
        kl: Annotated[KLConfig, Option("the KL penalty to a reference.")] = KLConfig(),
        entropy_coef: Annotated[float, Option("weight of the entropy bonus.", NON_NEGATIVE)] = 0.0,
        rollout_is: Annotated[
            ImportanceSamplingConfig, Option("importance-sampling correction of the sampler/trainer mismatch.")
        ] = ImportanceSamplingConfig(),
        rollout_staleness: Annotated[
            int,
            Option(
                "0: each step samples, then trains; K >= 1: the next rollout is sampled in the background and "
                "trained on K updates later (AReaL's decoupled PPO; rollout_is.mode null: token_mask)."
            ),
        ] = 0,
        dynamic_sampling: Annotated[DynamicSamplingConfig, Option("DAPO's dynamic sampling.")] = (
            DynamicSamplingConfig()
        ),
        replay: Annotated[ReplayConfig, Option("a replay buffer for groups whose rewards all agree.")] = ReplayConfig(),
        group_filter: Annotated[
            GroupFilterConfig, Option("GFPO: train on `keep` of the group_size responses sampled per prompt.")
        ] = GroupFilterConfig(),
        demonstrations: Annotated[
            DemonstrationConfig, Option("LUFFY: rows of each group that are the prompt's demonstration, not sampled.")
        ] = DemonstrationConfig(),
        update: Annotated[UpdateConfig, Option("the inner update (epochs, mini- and micro-batches).")] = UpdateConfig(),
        validation: Annotated[ValidationConfig, Option("how validation samples.")] = ValidationConfig(),
        teacher: Annotated[
            Policy | SelfTeacher | None,
            Option("on-policy distillation's frozen teacher (same tokenizer), or a SelfTeacher; null: none."),
        ] = None,
        distillation: Annotated[
            DistillationConfig, Option("with a teacher: the distillation and policy losses' weights.")
        ] = DistillationConfig(),
        positive_nll_coef: Annotated[
            float,
            Option(
                "VAPO's positive-example LM loss: weight of the NLL of the responses the task reward calls "
                "correct, averaged over their tokens (0: none).",
                NON_NEGATIVE,
            ),
        ] = 0.0,
    ) -> None:
        check_options(RLVRModule, locals())
        check_rollout_staleness(rollout_staleness)
        super().__init__(policy, optimizer, lr_scheduler, sampling, validation)
        self.save_hyperparameters(ignore=list(self.MODEL_ARGUMENTS))
        plain_hyperparameters(self)
        self.automatic_optimization = False
        self.loss = policy_loss(loss)
        self._set_group_sizes(group_size, group_filter, demonstrations)
        check_option_groups(self.loss, self.sampling, group_size, self.trained_group_size, dynamic_sampling, update,
                            replay, aggregation)  # fmt: skip
        check_demonstrations(demonstrations, self.loss, group_filter, replay, rollout_is, rollout_staleness, teacher)
        self.aggregation, self.kl, self.dynamic_sampling, self.update = aggregation, kl, dynamic_sampling, update
        self.rollout_staleness, self.rollout_is = rollout_staleness, rollout_is.with_staleness(rollout_staleness)
        self._build_update(policy, entropy_coef, teacher, distillation, positive_nll_coef)
        self.replay = replay_buffer(replay, self.policy_update)
        self.advantage_estimator: AdvantageCallback | None = None
        self.topup_prompts = TopUpPrompts()
        self.last_rollout: Rollout | None = None  # the step's trained batch (read by RolloutTableLogger)
        self.async_rollouts = (
            AsyncRollouts(policy, group_size, self.sampling, rollout_staleness) if rollout_staleness else None
        )

    def _set_group_sizes(self, group_size: int, group_filter, demonstrations) -> None:
        """Responses per prompt: `group_size` in a group, of them sampled the rest after the demonstrations, and
        trained those the group filter keeps."""
        self.group_size, self.group_filter, self.demonstrations = group_size, group_filter, demonstrations
        self.sampled_group_size = demonstrations.sampled_group_size(group_size)
        self.trained_group_size = group_filter.trained_group_size(group_size)

    def _build_update(
        self, policy: Policy, entropy_coef: float, teacher, distillation, positive_nll_coef: float
    ) -> None:
        """The inner update and the frozen models it reads: the KL reference and the distillation teacher."""
        self.reference = policy.create_reference() if self.kl.coef != 0 or self.loss.reads_reference else None
        self.loss_module = self.loss.attach(policy)  # a loss's own parameters: optimised and saved beside the policy
        check_distillation(teacher, distillation, policy)
        self.teacher = make_teacher(teacher, policy)  # frozen: off the module tree; a SelfTeacher's copy: in it
        self.policy_update = PolicyUpdate(
            policy, self.loss, self.aggregation, self.kl, self.reference, self.rollout_is, self.update, entropy_coef,
            self.sampling, teacher=self.teacher, distillation=distillation, positive_nll_coef=positive_nll_coef,
        )  # fmt: skip
        self.loss_constant = self.policy_update.loss_constant  # seq-sum-constant's divisor

    # ----------------------------------------------------------------- set-up

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if not self.reward_callbacks:
            raise ValueError("no RewardCallback in trainer.callbacks: add at least one reward to the config")
        self._setup_advantage_estimator([cb for cb in self.trainer.callbacks if isinstance(cb, AdvantageCallback)])
        self._check_batch_sizes()
        check_first_demonstration(self.demonstrations, self.trainer.datamodule, self.policy)

    def configure_model(self) -> None:
        super().configure_model()
        if self.teacher is not None:
            self.teacher.place(self)

    def check_sharding(self) -> None:
        if self.kl.refresh_every and getattr(self.policy, "lora_r", 0) > 0:
            raise NotImplementedError(
                "kl.refresh_every with a LoRA policy copies the adapter into a second one, which FSDP2 cannot add to "
                "an already sharded model; keep the reference fixed (kl.refresh_every: null) or train without sharding"
            )
        if self.async_rollouts is not None:
            raise NotImplementedError(
                "rollout_staleness >= 1 samples from a full copy of the policy in a background thread, which a sharded "
                "policy does not have; use rollout_staleness: 0 with FSDP2, or a DDP strategy"
            )

    def _setup_advantage_estimator(self, estimators: list[AdvantageCallback]) -> None:
        """A hook: `PPOModule` has its critic."""
        self.advantage_estimator = choose_advantage_estimator(self, estimators)

    def _check_batch_sizes(self) -> None:
        prompts = getattr(self.trainer.datamodule, "batch_size", None)
        mini_batch_size = self.update.mini_batch_size
        if prompts is None or mini_batch_size is None:
            return
        rows = prompts * self.trained_group_size
        if rows % mini_batch_size:
            per_prompt = "group_size" if self.group_filter.keep is None else "group_filter.keep"
            raise ValueError(
                f"update.mini_batch_size={mini_batch_size} must divide the rollout size "
                f"data.batch_size x {per_prompt} = {prompts} x {self.trained_group_size} = {rows}"
            )

    # ---------------------------------------------------------- training step

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = clock(self.device)
        refresh_reference(self)
        metrics: dict[str, Tensor | float] = {}
        with gathered_params(self.policy):  # sharded (FSDP2): gathered once for all of the step's sampling
            report_stage("generate")
            rollout, generation_stats = self._rollout_to_train(batch, metrics)
            if rollout is None:  # the first step of asynchronous rollouts only samples what the next step trains on
                metrics["time/generation_s"] = metrics["time/step_s"] = clock(self.device) - started
                publish_step_metrics(self, metrics)
                return
            if getattr(self.advantage_estimator, "reads_greedy_reward", False):  # PPOModule has none
                rollout.greedy_reward = self._greedy_rewards(batch, metrics)
            generated = clock(self.device)
            report_stage("score")
            self.score(rollout)
            metrics.update(retire_solved_prompts(self, rollout))  # before dynamic sampling drops solved groups
            metrics.update(demonstration_metrics(rollout))
            rollout = self._filter_groups(rollout, metrics)
            if self.dynamic_sampling.enabled:
                rollout = self._dynamic_sampling(rollout, metrics)
        if self.async_rollouts is not None:  # the next rollout is sampled while this one trains
            metrics["time/weight_push_s"] = self.async_rollouts.launch(batch, self.trainer.global_step)
        scored = clock(self.device)
        # a compilation in the rollout thread spans none of these draws (`runtime/global_random.py`)
        with GLOBAL_RANDOM_LOCK:
            if generation_stats is None:  # sampled in this thread: the policy's last generation (top-ups included)
                generation_stats = getattr(self.policy, "last_generation_stats", None)
            metrics.update(reward_metrics(rollout, self.reward_callbacks, generation_stats, prefix="train"))
            correct = self.correctness(rollout)
            metrics.update(bias_metrics(rollout, correct, self.aggregation, self.loss_constant))
            report_stage("log-probs")
            self.policy_update.add_old_and_reference_log_probs(rollout)
            if self.reference is not None and self.kl.coef != 0 and self.kl.mode == "reward":
                self._penalize_reward_with_kl(rollout, metrics)
            reads_correctness = getattr(self.advantage_estimator, "reads_correctness", False)  # PPOModule has none
            if self.policy_update.positive_nll_coef or reads_correctness or self.loss.reads_correctness:
                rollout.correct = correct_rows(correct, rollout, self.advantage_estimator, self.loss)
            rollout.advantages = self._advantages(rollout, metrics)
            if self.replay is not None:  # groups whose rewards all agree give way to groups trained on before
                rollout, stats = self.replay.refill(rollout, self.rollout_step)
                metrics.update({f"train/replay/{key}": value for key, value in stats.items()})
            self.last_rollout = rollout
            metrics["train/advantage_mean"] = rollout.advantages.mean()
            metrics["train/advantage_std"] = rollout.advantages.std() if rollout.advantages.numel() > 1 else 0.0
            report_stage("update")
            update_stats = self.policy_update.run(rollout, self)
        if self.async_rollouts is not None:  # 0 when sampling took no longer than the update
            self.async_rollouts.updated()
            metrics["time/rollout_wait_s"] = self.async_rollouts.wait()
        finished = clock(self.device)

        metrics.update(update_stats)
        metrics["train/skipped_updates"] = float(self.policy_update.skipped_updates)
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
            return self._sample_now(batch), None
        sampled = self.async_rollouts.take(batch, self.trainer.global_step)
        if sampled is None:
            return None, None
        metrics["time/generation_s"] = sampled.stats.pop("sampling_seconds")  # in the background, beside an update
        metrics["train/async/policy_lag"] = float(self.trainer.global_step - sampled.version)  # optimizer steps
        metrics.update(self.async_rollouts.step_metrics(sampled))  # policy versions (updates)
        return sampled.rollout, sampled.stats

    def _sample_now(self, batch: PromptBatch) -> Rollout:
        """`batch` sampled now with the current weights (the step's rollout, dynamic sampling's top-ups)."""
        if self.async_rollouts is None:
            sampled = self.policy.sample(batch, self.sampled_group_size, self.sampling)
            return add_demonstrations(self.policy, sampled, self.demonstrations, self.sampling.max_new_tokens)
        return self.async_rollouts.sample_now(batch, self.trainer.global_step).rollout  # nothing is in flight yet

    def _greedy_rewards(self, batch: PromptBatch, metrics: dict) -> Tensor:
        """The reward of a greedy response to each prompt of `batch`, one per row of its rollout (ReMax's baseline);
        the generation statistics stay those of the sampled rollout."""
        stats = getattr(self.policy, "last_generation_stats", None)
        greedy = self.policy.sample(batch, 1, dataclasses.replace(self.sampling, do_sample=False))
        self.policy.last_generation_stats = stats
        self.score(greedy)
        metrics["train/greedy_reward_mean"] = greedy.reward.mean()
        return greedy.reward.repeat_interleave(self.group_size)

    def _advantages(self, rollout: Rollout, metrics: dict) -> Tensor:
        """The rollout's advantages (a hook: `PPOModule` estimates them with GAE from its critic)."""
        if self.advantage_estimator.reads_token_energy:
            temperature, energy = self.policy_update.temperature, token_energy_from_logits
            with torch.no_grad():
                rollout.token_energy = self.policy_update.by_micro_batch(
                    rollout, lambda micro: self.policy.logit_statistics(micro, energy, temperature)
                )
            metrics["train/token_energy_mean"] = masked_mean(rollout.token_energy, rollout.response_mask)
        advantages = self.advantage_estimator.compute(rollout)
        metrics.update(self.advantage_estimator.step_metrics())
        return advantages

    def _filter_groups(self, rollout: Rollout, metrics: dict) -> Rollout:
        if self.group_filter.keep is None:
            return rollout
        rollout, stats = filter_groups(rollout, self.group_filter)
        metrics.update({f"train/group_filter/{key}": value for key, value in stats.items()})
        return rollout

    def _dynamic_sampling(self, rollout: Rollout, metrics: dict) -> Rollout:
        def sample_more() -> Rollout:
            report_stage("generate top-up")
            extra = self._sample_now(self.topup_prompts.next(self.trainer.datamodule))
            self.score(extra)
            return self._filter_groups(extra, {})

        rollout, stats = keep_informative_groups(rollout, sample_more, self.dynamic_sampling.max_rounds)
        metrics.update({f"train/dynamic_sampling/{key}": value for key, value in stats.items()})
        return rollout

    @torch.no_grad()
    def _penalize_reward_with_kl(self, rollout: Rollout, metrics: dict) -> None:
        """reward_i -= kl.coef * sum_t KL_t (PPO-style KL reward shaping; Ouyang et al. 2022 eq. 2)."""
        kl = self.policy_update.token_kl(rollout)
        penalty = self.kl.coef * masked_sum(kl, rollout.response_mask, dim=-1)
        rollout.reward = rollout.reward - penalty
        metrics["train/kl_reward_penalty"] = penalty.mean()
        metrics["train/kl"] = masked_mean(kl, rollout.response_mask)

    # ------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rlvr_counters"] = self.policy_update.state_dict()
        if self.replay is not None:
            checkpoint["rlvr_replay"] = ranks_state_dict(self.replay)
        if self.async_rollouts is not None:  # the rollout sampled during the last update, which the next step trains on
            checkpoint["rlvr_async_rollouts"] = self.async_rollouts.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.policy_update.load_state_dict(checkpoint.get("rlvr_counters", {}))
        if self.replay is not None and "rlvr_replay" in checkpoint:
            load_ranks_state_dict(self.replay, checkpoint["rlvr_replay"], self.global_rank, self.trainer.world_size)
        saved = checkpoint.get("rlvr_async_rollouts", {})
        if self.async_rollouts is not None and "rlvr_async_rollouts" in checkpoint:
            self.async_rollouts.load_state_dict(saved)
        elif saved.get("ready") is not None or saved.get("queue"):
            log.warning(
                "the checkpoint holds rollouts sampled for rollout_staleness >= 1; "
                "this run samples on-policy without them"
            )

    def teardown(self, stage: str) -> None:
        super().teardown(stage)
        if self.async_rollouts is not None:
            self.async_rollouts.close()

    @property
    def rollout_step(self) -> int:
        """Rollout steps completed so far (Lightning's logging step; restored from checkpoints)."""
        return self.trainer.fit_loop.epoch_loop._batches_that_stepped
