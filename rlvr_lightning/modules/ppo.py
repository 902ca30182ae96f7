"""`PPOModule`: PPO with a learned critic and generalised advantage estimation (verl's default algorithm).

`RLVRModule`'s rollout step, with advantages from a critic instead of a group baseline:

    1. rollout, rewards, old / reference log-probs as in RLVRModule (no AdvantageCallback)
    2. old values V_old [N, T] = value_head(trunk hidden states)                           no grad
       token rewards: each response's reward on its last token; kl.mode="reward" subtracts kl.coef * KL_t
       from every token's reward (Ouyang et al. 2022 eq. 2; verl apply_kl_penalty)
    3. advantages, returns = GAE(token rewards, V_old; gae.gamma, gae.lam)                    core/gae.py
       (gae.lam_critic: the returns from a lambda of their own, VC-PPO; gae.length_adaptive_alpha: a lambda per
       response from its length, VAPO)
       advantages whitened over the batch's response tokens (gae.whiten)
    4. update.epochs x mini- x micro-batches (`ValueUpdate`, modules/update/value_update.py):
           loss = RLVRModule's policy loss + value.coef * value loss (clipped around V_old) core/losses/value_loss.py
       one optimizer with two parameter groups: the policy (the optimizer's lr) and the critic (value.lr);
       each group's gradient norm is clipped to update.max_grad_norm on its own (as verl clips actor and critic)

During the first `value.warmup_steps` rollout steps only the critic learns: the policy loss is dropped
and a shared trunk reads detached hidden states, so the policy's parameters get no gradient at all.

The value model (`modules/value_model.py`): "separate" (verl: a critic model of its own, by default a
trainable copy of the policy) or "shared" (a value head on the policy's own hidden states, from the
policy's forward; the value loss also trains the policy's trunk).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor

from rlvr_lightning.advantages import AdvantageCallback
from rlvr_lightning.core.gae import gae_advantages, length_adaptive_lambda, outcome_token_rewards
from rlvr_lightning.core.losses.value_loss import explained_variance
from rlvr_lightning.core.masked import masked_mean, masked_normalize, masked_sum
from rlvr_lightning.modules.ppo_options import GAEConfig, ValueConfig
from rlvr_lightning.modules.rlvr import RLVRModule
from rlvr_lightning.modules.update.value_update import ValueUpdate
from rlvr_lightning.modules.value_model import ValueHead, check_hidden_states, trainable_copy
from rlvr_lightning.parallel.fsdp import data_parallel_mesh, shard_policy, shard_unit, sharding_options
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout


class PPOModule(RLVRModule):
    MODEL_ARGUMENTS = (*RLVRModule.MODEL_ARGUMENTS, "critic")

    def __init__(
        self,
        policy: Policy,
        critic: Policy | None = None,
        value: ValueConfig = ValueConfig(),
        gae: GAEConfig = GAEConfig(),
        **kwargs: Any,
    ) -> None:
        """
        Args:
            policy: the model being trained; it must expose hidden states for a shared value head.
            critic: the separate critic's trunk, any policy that exposes hidden states (e.g. a smaller model);
                null: a trainable copy of the policy.
            value: the value model and its loss (model, lr, coef, clip, warmup_steps).
            gae: generalised advantage estimation (gamma, lam, whiten, lam_critic, length_adaptive_alpha).
            **kwargs: `RLVRModule`'s options (loss, aggregation, kl, update, validation, ...).
        """
        super().__init__(policy, **kwargs)
        if self.replay is not None:
            raise ValueError("replay does not apply to PPOModule: GAE gives groups whose rewards agree advantages too")
        if critic is not None and value.model == "shared":
            raise ValueError(
                "critic is the trunk of a separate value model; value.model='shared' reads the policy's own "
                "hidden states"
            )
        if value.model == "separate":
            self.critic = critic if critic is not None else trainable_copy(policy)
            hidden_size = check_hidden_states(self.critic, "critic")
        else:
            self.critic = None
            hidden_size = check_hidden_states(policy, "shared value head")
        self.value_head = ValueHead(hidden_size)
        self.value, self.gae = value, gae
        # RLVRModule's update, training the critic too
        self.policy_update = ValueUpdate(self.critic, self.value_head, value, **self.policy_update.options())
        self._token_kl_penalty: Tensor | None = None  # kl.coef * KL_t of this step (kl.mode="reward")

    # ----------------------------------------------------------------- set-up

    def critic_parameters(self) -> list[torch.nn.Parameter]:
        """The value head's parameters and, for a separate value model, its trunk's."""
        return self.policy_update.critic_parameters()

    def optimized_parameters(self) -> list[dict]:
        """Two parameter groups: the policy's, and the critic's (with `value.lr` when set)."""
        critic_group: dict = {"params": self.critic_parameters()}
        if self.value.lr is not None:
            critic_group["lr"] = self.value.lr
        return [{"params": super().optimized_parameters()}, critic_group]

    def configure_model(self) -> None:
        super().configure_model()
        strategy, mesh = self.trainer.strategy, data_parallel_mesh(self)
        if mesh is not None:  # FSDP2: the critic is sharded as the policy is (its gradients are reduced across ranks)
            options = sharding_options(strategy)
            if self.critic is not None:
                shard_policy(self.critic, mesh, options, root_reshard_after_forward=False)
            shard_unit(self.value_head, mesh, dataclasses.replace(options, param_dtype=None))  # computes in float32
        elif isinstance(strategy, DDPStrategy) and (self.critic is not None or self.value.warmup_steps):
            # DDP waits at every synchronised backward for a gradient of each parameter: during the warm-up the
            # policy gets none, and a separate critic reads hidden states, so its trunk's output layer gets none.
            # An explicit find_unused_parameters=false is kept (DDP then names the fix).
            strategy._ddp_kwargs.setdefault("find_unused_parameters", True)

    def _setup_advantage_estimator(self, estimators: list[AdvantageCallback]) -> None:
        if estimators:
            names = ", ".join(type(cb).__name__ for cb in estimators)
            raise ValueError(
                f"PPOModule estimates advantages with GAE from its critic; remove {names} from trainer.callbacks"
            )
        self.advantage_estimator = None

    @property
    def warming_up(self) -> bool:
        """Whether this rollout step trains the critic only."""
        return self.rollout_step < self.value.warmup_steps

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self.policy_update.warming_up = self.warming_up

    # ------------------------------------------------------------- advantages

    @torch.no_grad()
    def _penalize_reward_with_kl(self, rollout: Rollout, metrics: dict) -> None:
        """kl.mode="reward": every token's reward is -kl.coef * KL_t, the last one's plus the task reward
        (Ouyang et al. 2022 eq. 2; verl apply_kl_penalty)."""
        mask = rollout.response_mask
        kl = self.policy_update.token_kl(rollout)
        self._token_kl_penalty = self.kl.coef * kl * mask.to(kl.dtype)
        metrics["train/kl_reward_penalty"] = masked_sum(self._token_kl_penalty, mask, dim=-1).mean()
        metrics["train/kl"] = masked_mean(kl, mask)

    @torch.no_grad()
    def _advantages(self, rollout: Rollout, metrics: dict) -> Tensor:
        mask = rollout.response_mask
        update = self.policy_update
        values = update.by_micro_batch(rollout, update.values)
        token_rewards = outcome_token_rewards(rollout.reward, mask)
        if self._token_kl_penalty is not None:
            token_rewards = token_rewards - self._token_kl_penalty
            self._token_kl_penalty = None
        lam = self.gae.lam
        if self.gae.length_adaptive_alpha is not None:  # VAPO: one lambda per response, from its length
            lam = length_adaptive_lambda(mask.sum(dim=-1), self.gae.length_adaptive_alpha)
        advantages, returns = gae_advantages(token_rewards, values, mask, self.gae.gamma, lam)
        if self.gae.lam_critic is not None:  # VC-PPO's decoupled GAE: the critic's targets from their own lambda
            _, returns = gae_advantages(token_rewards, values, mask, self.gae.gamma, self.gae.lam_critic)
        if self.gae.whiten:
            # (A - mean) / sqrt(var + 1e-8) over the response tokens  (verl compute_gae_advantage_return: masked_whiten)
            advantages = masked_normalize(advantages, mask)
        rollout.values, rollout.returns = values, returns
        metrics["train/critic/values_mean"] = masked_mean(values, mask)
        metrics["train/critic/returns_mean"] = masked_mean(returns, mask)
        metrics["train/critic/explained_variance"] = explained_variance(values, returns, mask)
        metrics["train/critic/warmup"] = float(self.warming_up)
        return advantages
