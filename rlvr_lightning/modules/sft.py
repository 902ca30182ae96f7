"""`SFTModule`: supervised fine-tuning on prompt/response pairs, the cold-start and distillation
stage of an R1-style pipeline. Same policies, tasks, rewards and CLI as `RLVRModule`:

    rlvr fit --config configs/recipes/sft.yaml --data.init_args.train_file=pairs.jsonl

The loss is the negative log-likelihood of the response tokens only (the prompt is context,
never a target), teacher-forced through the policy's own `token_log_probs` on a `Rollout`
built from the pairs (`pair_rollout`), so whatever scores tokens for RL scores them here.
`aggregation: {mode: token-mean}` (default) averages over every response token of the batch (the
usual SFT loss); "seq-mean-token-mean" averages each response first.

Validation reports `val/nll` on validation pairs and, when the run configures rewards, samples
the validation prompts and reports `val/reward_mean` and `val/accuracy` exactly as `RLVRModule`
does, so the stages of a pipeline are compared on one number.

To start a later stage (GRPO, expert iteration) from this one, wrap its policy in
`policy_from_checkpoint` (below): the weights are loaded before the module is built, so a KL
reference is a copy of the fine-tuned policy, and no trainer state (step, optimizer) carries over.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from rlvr_lightning.core.aggregation import AGGREGATION_MODES, aggregate_loss
from rlvr_lightning.modules.options import AggregationConfig, ValidationConfig, plain_hyperparameters
from rlvr_lightning.modules.scoring import RewardScoring
from rlvr_lightning.modules.training_precision import TrainingPrecisionCheck
from rlvr_lightning.parallel.fsdp import ShardedPolicyModule, is_sharded
from rlvr_lightning.policies.base import Policy, SamplingConfig, compute_device
from rlvr_lightning.rewards.base import RewardCallback, find_reward_callbacks
from rlvr_lightning.rollout import Rollout

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ pairs -> Rollout


def _is_text_policy(policy: Policy) -> bool:
    """Language-model policies (`HFPolicy`) tokenise text themselves; toy policies take token ids."""
    return hasattr(policy, "tokenizer") and hasattr(policy, "encode_prompts")


def _is_token_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) for t in value)


def _response_ids(policy: Policy, response: Any) -> list[int]:
    """Token ids of one response. Text is tokenised without special tokens and ends with EOS
    (so the model learns to stop); token-id lists are taken as they are."""
    if _is_token_list(response):
        return list(response)
    if not _is_text_policy(policy):
        raise TypeError(f"{type(policy).__name__} takes responses as token-id lists, got {type(response).__name__}")
    ids = list(policy.tokenizer(response, add_special_tokens=False)["input_ids"])
    eos = list(getattr(policy, "eos_token_ids", []) or [])
    if eos and (not ids or ids[-1] not in eos):
        ids.append(eos[0])
    return ids


def _pad(rows: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[Tensor, Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span] = torch.as_tensor(list(row), dtype=torch.long)
            mask[i, span] = 1
    return ids, mask


def pair_rollout(
    policy: Policy, prompts: Sequence[Any], responses: Sequence[Any], metadata: Sequence[dict] | None = None
) -> Rollout:
    """A teacher-forcing `Rollout` (group size 1) of given (prompt, response) pairs for `policy.token_log_probs`.

    Prompts are left-padded, responses right-padded; `response_mask` covers the response tokens only.
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"pair_rollout needs as many responses as prompts (>= 1), got {len(prompts)} and {len(responses)}")
    if _is_text_policy(policy):
        prompt_ids_list, prompt_text = policy.encode_prompts(list(prompts))
        pad_id = int(policy.pad_token_id)
    else:
        for i, prompt in enumerate(prompts):
            if not _is_token_list(prompt):
                raise TypeError(f"{type(policy).__name__} takes prompts as token-id lists; prompt {i} is {type(prompt).__name__}")
        prompt_ids_list, prompt_text, pad_id = [list(p) for p in prompts], None, 0
    response_ids_list = [_response_ids(policy, response) for response in responses]
    for name, rows, expected in (
        ("prompt", prompt_ids_list, getattr(policy, "prompt_length", None)),
        ("response", response_ids_list, getattr(policy, "response_length", None)),
    ):
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"{name} {i} of the batch is empty")
            if expected is not None and not _is_text_policy(policy) and len(row) != expected:
                raise ValueError(
                    f"{type(policy).__name__} has {name}_length={expected}, but {name} {i} of the batch has "
                    f"{len(row)} tokens: {row}"
                )
    prompt_ids, prompt_mask = _pad(prompt_ids_list, pad_id, left=True)
    response_ids, response_mask = _pad(response_ids_list, pad_id, left=False)
    device = compute_device(policy)
    rows = len(prompts)
    return Rollout(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        response_ids=response_ids.to(device),
        response_mask=response_mask.float().to(device),
        group_index=torch.arange(rows, device=device),
        group_size=1,
        truncated=torch.zeros(rows, dtype=torch.bool, device=device),
        prompt_text=list(prompt_text) if prompt_text is not None else None,
        response_text=list(responses) if all(isinstance(r, str) for r in responses) else None,
        metadata=[dict(m) for m in metadata] if metadata else [{} for _ in range(rows)],
    )


def response_nll(
    policy: Policy, rollout: Rollout, aggregation: AggregationConfig = AggregationConfig(mode="token-mean"), **normalisers
) -> Tensor:
    """Mean negative log-likelihood of the response tokens of `rollout` (differentiable)."""
    log_probs, _ = policy.token_log_probs(rollout, temperature=1.0)
    return aggregate_loss(
        -log_probs, rollout.response_mask, aggregation.mode, count_empty_rows=aggregation.count_empty_rows, **normalisers
    )


def check_nll_aggregation(aggregation: AggregationConfig) -> None:
    """The likelihood losses have no fixed response length to divide by: seq-sum-constant does not apply."""
    if aggregation.mode == "seq-sum-constant":
        choices = [m for m in AGGREGATION_MODES if m != "seq-sum-constant"]
        raise ValueError(f"aggregation.mode={aggregation.mode!r} is not valid for a likelihood loss; choose one of {choices}")


# ------------------------------------------------------------------ checkpoints


def policy_from_checkpoint(
    policy: Policy, checkpoint_path: str, strict: bool = True, weights_only: bool = True
) -> Policy:
    """`policy` with the weights of an earlier stage loaded into it (use it wherever a policy goes):

        policy:
          class_path: rlvr_lightning.modules.sft.policy_from_checkpoint
          init_args:
            checkpoint_path: runs/sft/sft.ckpt
            policy:
              class_path: rlvr_lightning.policies.toy_sort.ToySortPolicy
              init_args: {...}   # the same architecture as the checkpoint's

    `checkpoint_path` is a Lightning checkpoint of any module that keeps its policy as `self.policy`
    (SFTModule, ExpertIterationModule, RLVRModule: the `policy.*` weights are taken, a KL reference
    is not; a `.ckpt` file or the directory of shards of a sharded run) or a plain `policy.state_dict()`
    saved with `torch.save`. Only the weights are loaded:
    the new run starts at step 0 with a fresh optimizer (unlike `--ckpt_path`, which resumes a run).
    `weights_only=False` is needed for checkpoints that hold Python objects (load only checkpoints you trust
    then); the modules keep their options as plain data.
    """
    path = Path(checkpoint_path)
    if path.is_dir():  # a sharded (FSDP2) run's checkpoint
        from rlvr_lightning.checkpoint_files import read_sharded_weights

        state = read_sharded_weights(path, {f"policy.{k}": v for k, v in policy.state_dict().items()})
        policy.load_state_dict({k.removeprefix("policy."): v for k, v in state.items()}, strict=strict)
        log.info("loaded policy weights from the sharded checkpoint %s", checkpoint_path)
        return policy
    if not path.is_file():
        raise FileNotFoundError(f"policy_from_checkpoint: checkpoint_path={checkpoint_path!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as error:
        hint = "" if not weights_only else " (if it holds Python objects and you trust it, set weights_only: false)"
        raise RuntimeError(f"policy_from_checkpoint: cannot read {checkpoint_path!r}{hint}: {error}") from error
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"policy_from_checkpoint: {checkpoint_path!r} holds neither a Lightning checkpoint nor a state dict")
    if any(key.startswith("policy.") for key in state):
        state = {key.removeprefix("policy."): value for key, value in state.items() if key.startswith("policy.")}
    try:
        policy.load_state_dict(state, strict=strict)
    except RuntimeError as error:
        raise RuntimeError(
            f"policy_from_checkpoint: the weights in {checkpoint_path!r} do not fit {type(policy).__name__} "
            f"(configure the same architecture as the stage that wrote them): {error}"
        ) from error
    log.info("loaded policy weights from %s", checkpoint_path)
    return policy


# ------------------------------------------------------------------ rewards (shared with ExpertIterationModule)


class RewardScoringMixin(RewardScoring):
    """`RewardScoring` (scoring, correctness, the sampled validation loop), with that validation
    loop also reachable as `sample_and_validate` for modules that override `validation_step`."""

    sample_and_validate = RewardScoring.validation_step


# ------------------------------------------------------------------ the module


class SFTModule(TrainingPrecisionCheck, RewardScoringMixin, ShardedPolicyModule, pl.LightningModule):
    def __init__(
        self,
        policy: Policy,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        aggregation: AggregationConfig = AggregationConfig(mode="token-mean"),
        sampling: SamplingConfig | None = None,
        validation: ValidationConfig = ValidationConfig(),
        save_pretrained_dir: str | None = None,
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
                (Hugging Face policies: the next stage loads it as `model_name_or_path`).

        Gradient clipping and accumulation are the Trainer's (`trainer.gradient_clip_val`, ...).
        """
        super().__init__()
        self.save_hyperparameters(ignore=["policy", "optimizer", "lr_scheduler", "sampling"])
        plain_hyperparameters(self)
        check_nll_aggregation(aggregation)
        if save_pretrained_dir is not None and not hasattr(policy, "save_pretrained"):
            raise ValueError(f"save_pretrained_dir is set, but {type(policy).__name__} has no save_pretrained()")
        self.policy = policy
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.aggregation = aggregation
        self.sampling = sampling or SamplingConfig()
        self.validation = validation
        self.save_pretrained_dir = save_pretrained_dir
        self.reward_callbacks: list[RewardCallback] = []

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.policy.parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler_factory(optimizer)}

    def setup(self, stage: str) -> None:
        self.reward_callbacks = find_reward_callbacks(self.trainer.callbacks)

    def _batch_rollout(self, batch: dict[str, list]) -> Rollout:
        return pair_rollout(self.policy, batch["prompt"], batch["response"], batch.get("metadata"))

    def training_step(self, batch: dict[str, list], batch_idx: int) -> Tensor:
        rollout = self._batch_rollout(batch)
        loss = response_nll(self.policy, rollout, self.aggregation)
        tokens = rollout.response_mask.sum()
        self.log_dict(
            {"train/loss": loss.detach(), "train/response_tokens": tokens},
            on_step=True, on_epoch=False, prog_bar=False, batch_size=rollout.num_rows,
        )
        self.log("loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True, logger=False, batch_size=rollout.num_rows)
        return loss

    def validation_step(self, batch: dict[str, list], batch_idx: int) -> None:
        if "response" in batch:
            rollout = self._batch_rollout(batch)
            nll = response_nll(self.policy, rollout, self.aggregation)
            self.log("val/nll", nll, on_step=False, on_epoch=True, batch_size=rollout.num_rows, prog_bar=True)
        if self.reward_callbacks:
            prompts = {"prompt": batch["prompt"], "metadata": batch.get("metadata")}
            self.sample_and_validate(prompts, batch_idx)

    def configure_model(self) -> None:
        super().configure_model()
        if self.save_pretrained_dir is not None and is_sharded(self.policy):
            raise ValueError(
                "save_pretrained_dir writes the policy from one process, but it is sharded across processes (FSDP2); "
                "export the run's last checkpoint instead: rlvr export --config ... --ckpt_path ... --output_dir ..."
            )

    def on_train_end(self) -> None:
        if self.save_pretrained_dir is not None and self.trainer.is_global_zero:
            os.makedirs(self.save_pretrained_dir, exist_ok=True)
            self.policy.save_pretrained(self.save_pretrained_dir)
