"""`PolicyModule`: what every training module shares (`RLVRModule`, `PPOModule`, `SFTModule`,
`ExpertIterationModule`).

    the policy, the optimizer and scheduler factories        configure_optimizers (optimized_parameters)
    the run's rewards                                        setup: reward_callbacks from trainer.callbacks
    scoring and correctness                                  score, correctness (modules/scoring.py)
    the sampled validation loop and predictions              validation_step, predict_step
    where the modules compute, FSDP2                         configure_model (parallel/fsdp.py)
    fp32 master weights; bf16 clipping of fused optimizers   on_fit_start, clip_gradients (training_precision.py)
    no cuDNN attention while fitting on a GPU                on_fit_start, teardown (modules/attention_kernels.py)

Validation samples `validation.group_size` (greedy or sampled) responses per held-out prompt: mean reward
and accuracy per batch, and pass@k, majority-vote accuracy, format rate and response length as torchmetrics
over the epoch. Prompt batches are Python objects: `transfer_batch_to_device` leaves them to the policy.
"""

from __future__ import annotations

import dataclasses

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor

from rlvr_lightning.evaluation.metrics import ValidationMetrics
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import scoring
from rlvr_lightning.modules.attention_kernels import restore_cudnn_attention, turn_off_cudnn_attention
from rlvr_lightning.modules.options import ValidationConfig
from rlvr_lightning.modules.training_precision import check_training_precision, clipping_without_a_scaler
from rlvr_lightning.parallel.fsdp import data_parallel_mesh, gathered_params, shard_for_training
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.rewards.base import RewardCallback, find_reward_callbacks
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.checkpoint_files import CheckpointReadError

#: state-dict prefixes of what a module trains with but does not evaluate with
TRAINING_COMPANIONS = ("reference.", "teacher.", "critic.", "value_head.", "loss_module.")


class PolicyModule(pl.LightningModule):
    def __init__(
        self,
        policy: Policy,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        sampling: SamplingConfig | None = None,
        validation: ValidationConfig = ValidationConfig(),
    ) -> None:
        """
        Args:
            policy: the model being trained (ToySortPolicy, HFPolicy, ...).
            optimizer: the optimizer's class and options (class_path, init_args); default Adam.
            lr_scheduler: a learning-rate scheduler, stepped with every optimizer step (null: none).
            sampling: how responses are sampled (temperature, max_new_tokens, ...).
            validation: responses per validation prompt and greedy decoding (group_size, greedy).
        """
        super().__init__()
        self.policy = policy
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.sampling = sampling or SamplingConfig()
        self.validation = validation
        self.reference: Policy | None = None  # a frozen copy of the policy (RLVRModule's KL reference)
        self.loss_module: torch.nn.Module | None = None  # a loss's own trainable parameters (`PolicyLoss.attach`)
        self.reward_callbacks: list[RewardCallback] = []
        self._cudnn_attention_was_on: bool | None = None

    # ----------------------------------------------------------------- set-up

    def optimized_parameters(self) -> list:
        """What the optimizer steps: the policy's parameters and the loss's own (`PPOModule`: two parameter
        groups)."""
        own = [] if self.loss_module is None else list(self.loss_module.parameters())
        return [*self.policy.parameters(), *own]

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.optimized_parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}

    def setup(self, stage: str) -> None:
        self.reward_callbacks = find_reward_callbacks(self.trainer.callbacks)

    def clip_gradients(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's, which under bf16-mixed also clips for a fused optimizer (`clipping_without_a_scaler`)."""
        with clipping_without_a_scaler(getattr(self._trainer, "precision_plugin", None)):  # None: under Fabric
            super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_model(self) -> None:
        """Record where the modules compute; shard the policy (and reference) under FSDP2 (`parallel/fsdp.py`)."""
        if data_parallel_mesh(self) is not None:
            if self.loss_module is not None:
                raise NotImplementedError(
                    "a loss with trainable parameters of its own (FlowRL's log_z: learned) is not sharded with the "
                    "policy under FSDP2: use log_z: group, or a DDP strategy"
                )
            self.check_sharding()
        shard_for_training(self, self.policy, self.reference)

    def check_sharding(self) -> None:
        """Raise when an option of this module does not work with a sharded policy (before anything is sharded)."""

    def on_fit_start(self) -> None:
        # after Lightning's precision plugin converted the weights and the strategy sharded them
        check_training_precision(self)
        self._cudnn_attention_was_on = turn_off_cudnn_attention(self.device)

    def teardown(self, stage: str) -> None:
        restore_cudnn_attention(self._cudnn_attention_was_on)
        self._cudnn_attention_was_on = None

    def transfer_batch_to_device(self, batch: PromptBatch, device: torch.device, dataloader_idx: int) -> PromptBatch:
        """Prompt batches are Python objects (token lists, text, metadata): the policy places what it tensorises."""
        return batch

    # ---------------------------------------------------------------- scoring

    def score(self, rollout: Rollout) -> None:
        """Fill `rollout.rewards` (unweighted, by name) and `rollout.reward` (weighted sum)."""
        scoring.score(rollout, self.reward_callbacks)

    def correctness(self, rollout: Rollout, kind: str = "task") -> Tensor | None:
        """`bool[N]` from the first reward of this `kind` that can tell whether a response satisfies it."""
        return scoring.correctness(rollout, self.reward_callbacks, kind)

    def per_reward_metrics(self, rollout: Rollout, prefix: str) -> dict[str, Tensor | float]:
        """Each reward's mean and the rows it failed on since the last call."""
        return scoring.per_reward_metrics(rollout, self.reward_callbacks, prefix)

    # ------------------------------------------------------------- validation

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self.validate_by_sampling(batch)

    def validate_by_sampling(self, batch: PromptBatch) -> None:
        """`validation.group_size` responses per held-out prompt: mean reward and accuracy per batch; pass@k,
        majority vote, format rate and response length accumulate in `validation_metrics` for the epoch."""
        sampling = dataclasses.replace(self.sampling, do_sample=not self.validation.greedy)
        with gathered_params(self.policy):
            rollout = self.policy.sample(batch, self.validation.group_size, sampling)
        self.score(rollout)
        metrics = {"val/reward_mean": rollout.reward.mean()}
        correct = self.correctness(rollout)
        if correct is not None:
            metrics["val/accuracy"] = correct.float().mean()
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=rollout.num_rows, prog_bar=True, sync_dist=True)
        format_ok = self.correctness(rollout, kind="format")
        answers = scoring.final_answers(rollout, self.reward_callbacks)
        # `trainer.validate` runs in inference mode; metric states must stay ordinary tensors across passes.
        with torch.inference_mode(False):
            plain = lambda t: None if t is None else t.clone()  # noqa: E731
            masked = dataclasses.replace(rollout, response_mask=rollout.response_mask.clone())
            self.validation_metrics.update(masked, plain(correct), answers, plain(format_ok))

    @property
    def validation_metrics(self) -> ValidationMetrics:
        if getattr(self, "_validation_metrics", None) is None:
            with torch.inference_mode(False):
                metrics = ValidationMetrics(self.validation.group_size, self.validation.pass_at_k)
                self._validation_metrics = metrics.to(self.device)
        return self._validation_metrics

    def on_validation_epoch_end(self) -> None:
        with torch.inference_mode(False):
            computed = self.validation_metrics.compute()  # torchmetrics syncs across ranks itself
            self.validation_metrics.reset()
        computed.pop("accuracy", None)  # logged per batch above
        if computed:
            self.log_dict({f"val/{name}": value for name, value in computed.items()}, on_epoch=True)

    # ------------------------------------------------------------ checkpoints

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint's training companions (KL reference, teacher, critic) need not match the config's to evaluate or
        predict: those the config lacks are dropped, those it has that the checkpoint lacks keep their built weights
        (`rlvr eval` of a run with a KL reference under a config without one). To resume fitting they must match."""
        state, own = checkpoint.get("state_dict", {}), self.state_dict()
        extra = sorted({key.split(".")[0] for key in state if key.startswith(TRAINING_COMPANIONS) and key not in own})
        if self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING:
            if extra:
                raise CheckpointReadError(
                    f"the checkpoint holds the weights of a {' and a '.join(extra)} that this config does not build "
                    "(kl.coef, teacher, the module's class): resume a run with its own config, or train from its "
                    "policy's weights with rlvr_lightning.modules.policy_from_checkpoint"
                )
            return
        for key in [key for key in state if key.split(".")[0] in extra]:
            del state[key]
        state.update(
            {key: value for key, value in own.items() if key.startswith(TRAINING_COMPANIONS) and key not in state}
        )

    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[dict]:
        """`validation.group_size` completions per prompt, decoded as in validation and scored: one row each
        (`rlvr predict` writes them to JSONL)."""
        sampling = dataclasses.replace(self.sampling, do_sample=not self.validation.greedy)
        prompts = {"prompt": batch["prompt"], "metadata": batch.get("metadata")}
        with gathered_params(self.policy):
            rollout = self.policy.sample(prompts, self.validation.group_size, sampling)
        self.score(rollout)
        return scoring.completion_rows(rollout, self.correctness(rollout))
