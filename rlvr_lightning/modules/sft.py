"""`SFTModule`: supervised fine-tuning on prompt/response pairs, the cold-start and distillation
stage of an R1-style pipeline. Same policies, tasks, rewards and CLI as `RLVRModule`:

    rlvr fit --config configs/recipes/sft.yaml --data.init_args.train_file=pairs.jsonl

The loss is the negative log-likelihood of the response tokens only (the prompt is context,
never a target), teacher-forced through the policy's own `token_log_probs` on a `Rollout`
built from the pairs (`pair_rollout`), so whatever scores tokens for RL scores them here.
`aggregation: {mode: token-mean}` (default) averages over every response token of the batch (the
usual SFT loss); "seq-mean-token-mean" averages each response first. `loss: dft` weighs each token's
negative log-likelihood by the token's probability (dynamic fine-tuning, Wu et al. 2025,
`core/losses/likelihood.py`); validation still reports the plain `val/nll`.

Validation reports `val/nll` on validation pairs and, when the run configures rewards, samples
the validation prompts and reports `val/reward_mean` and `val/accuracy` exactly as `RLVRModule`
does, so the stages of a pipeline are compared on one number.

To start a later stage (GRPO, expert iteration) from this one, wrap its policy in
`policy_from_checkpoint` (`modules/policy_checkpoint.py`): the weights are loaded before the module is built, so a KL
reference is a copy of the fine-tuned policy, and no trainer state (step, optimizer) carries over.
"""

from __future__ import annotations

import os
from typing import Annotated

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from rlvr_lightning.core.losses.likelihood import LIKELIHOOD_LOSSES
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.modules.options import ValidationConfig, plain_hyperparameters
from rlvr_lightning.modules.pair_rollouts import check_nll_aggregation, pair_rollout, response_loss, response_nll
from rlvr_lightning.modules.policy_checkpoint import policy_from_checkpoint
from rlvr_lightning.modules.policy_module import PolicyModule
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import OneOf

# configs name the loader as rlvr_lightning.modules.sft.policy_from_checkpoint
__all__ = ["SFTModule", "policy_from_checkpoint"]


@documented_options
class SFTModule(PolicyModule):
    def __init__(
        self,
        policy: Policy,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        aggregation: AggregationConfig = AggregationConfig(mode="token-mean"),
        sampling: SamplingConfig | None = None,
        validation: ValidationConfig = ValidationConfig(),
        save_pretrained_dir: str | None = None,
        loss: Annotated[
            str,
            Option(
                "the per-token loss: nll | dft (the NLL times the token's stop-gradient probability; Wu et al. "
                "2025, dynamic fine-tuning).",
                OneOf(LIKELIHOOD_LOSSES),
            ),
        ] = "nll",
    ) -> None:
        """
        Args:
            policy: the model being fine-tuned (ToySortPolicy, HFPolicy, ...).
            optimizer: the optimizer's class and options (class_path, init_args); default Adam.
            lr_scheduler: a learning-rate scheduler (null: none).
            aggregation: how response-token losses become the batch loss: mode token-mean (every token weighs the
                same) | seq-mean-token-mean (every response does) | seq-mean-token-sum.
            sampling: how validation prompts are sampled when the run has rewards.
            validation: responses per validation prompt and greedy decoding (group_size, greedy).
            save_pretrained_dir: when training ends, also write the policy there with `policy.save_pretrained`
                (Hugging Face policies: the next stage loads it as `model.name_or_path`).

        Gradient clipping and accumulation are the Trainer's (`trainer.gradient_clip_val`, ...).
        """
        check_options(SFTModule, locals())
        super().__init__(policy, optimizer, lr_scheduler, sampling, validation)
        self.save_hyperparameters(ignore=["policy", "optimizer", "lr_scheduler", "sampling"])
        plain_hyperparameters(self)
        check_nll_aggregation(aggregation)
        if save_pretrained_dir is not None and not hasattr(policy, "save_pretrained"):
            raise ValueError(f"save_pretrained_dir is set, but {type(policy).__name__} has no save_pretrained()")
        self.aggregation = aggregation
        self.save_pretrained_dir = save_pretrained_dir
        self.loss = loss

    def _batch_rollout(self, batch: dict[str, list]) -> Rollout:
        return pair_rollout(self.policy, batch["prompt"], batch["response"], batch.get("metadata"))

    def training_step(self, batch: dict[str, list], batch_idx: int) -> Tensor:
        rollout = self._batch_rollout(batch)
        loss = response_loss(self.policy, rollout, self.aggregation, self.loss)
        tokens = rollout.response_mask.sum()
        rows = rollout.num_rows
        metrics = {"train/loss": loss.detach(), "train/response_tokens": tokens}
        self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False, batch_size=rows)
        self.log("loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True, logger=False, batch_size=rows)
        return loss

    def validation_step(self, batch: dict[str, list], batch_idx: int) -> None:
        if "response" in batch:
            rollout = self._batch_rollout(batch)
            nll = response_nll(self.policy, rollout, self.aggregation)
            self.log("val/nll", nll, on_step=False, on_epoch=True, batch_size=rollout.num_rows, prog_bar=True)
        if self.reward_callbacks:
            self.validate_by_sampling({"prompt": batch["prompt"], "metadata": batch.get("metadata")})

    def check_sharding(self) -> None:
        if self.save_pretrained_dir is not None:
            raise ValueError(
                "save_pretrained_dir writes the policy from one process, but it is sharded across processes (FSDP2); "
                "export the run's last checkpoint instead: rlvr export --config ... --ckpt_path ... --output_dir ..."
            )

    def on_train_end(self) -> None:
        if self.save_pretrained_dir is not None and self.trainer.is_global_zero:
            os.makedirs(self.save_pretrained_dir, exist_ok=True)
            self.policy.save_pretrained(self.save_pretrained_dir)
