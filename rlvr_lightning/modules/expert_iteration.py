"""`ExpertIterationModule`: sample, keep what passes the reward, fine-tune on it, repeat
(expert iteration / rejection-sampling fine-tuning: Anthony et al. 2017; STaR, Zelikman et
al. 2022; ReST-EM, Singh et al. 2023).

One training step is one round:

    1. rollout = policy.sample(prompts, n=group_size)          data.batch_size prompts, no grad
    2. rewards = the run's RewardCallbacks (trainer.callbacks)  as RLVRModule scores them
    3. keep    = responses the task reward calls correct, or whose total reward >= reward_threshold;
                 at most max_per_prompt per prompt
    4. epochs_per_round passes over the kept responses, in mini-batches of mini_batch_size rows:
           loss = negative log-likelihood of the response tokens (SFTModule's loss)

so `trainer.limit_train_batches` is the number of rounds. A round sees `data.batch_size` prompts
(set it to the size of a finite prompt set to sample every prompt each round). Validation is
RLVRModule's (the same `val/accuracy`). Lightning's `global_step` counts optimizer steps.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from rlvr_lightning.core.aggregation import AGGREGATION_MODES
from rlvr_lightning.distributed import all_gather
from rlvr_lightning.modules.gradients import backward_sync, policy_gradient_norm
from rlvr_lightning.modules.rlvr import RLVRModule
from rlvr_lightning.modules.sft import RewardScoringMixin, response_nll
from rlvr_lightning.modules.step_metrics import publish_step_metrics
from rlvr_lightning.modules.training_precision import TrainingPrecisionCheck
from rlvr_lightning.parallel.fsdp import ShardedPolicyModule, gathered_params
from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.rewards.base import RewardCallback, find_reward_callbacks
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.timing import clock

log = logging.getLogger(__name__)


class ExpertIterationModule(TrainingPrecisionCheck, RewardScoringMixin, ShardedPolicyModule, pl.LightningModule):
    def __init__(
        self,
        policy: Policy,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        group_size: int = 8,
        sampling: SamplingConfig | None = None,
        reward_threshold: float | None = None,
        max_per_prompt: int | None = None,
        epochs_per_round: int = 2,
        mini_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        aggregation: str = "token-mean",
        max_grad_norm: float | None = 1.0,
        val_group_size: int = 1,
        val_greedy: bool = True,
    ) -> None:
        """
        Args:
            policy: the model being trained (`ToySortPolicy`, `HFPolicy`, ...).
            group_size: responses sampled per prompt in each round.
            reward_threshold: keep responses whose weighted total reward is >= this; None keeps the ones the
                task reward's `is_correct` accepts (exact sort, verified answer, ...).
            max_per_prompt: keep at most this many passing responses per prompt (None: all of them), so easy
                prompts do not crowd out hard ones.
            epochs_per_round: passes over the kept responses in each round (E).
            mini_batch_size, micro_batch_size: rows per optimizer step / per backward pass (None: all kept rows /
                the whole mini-batch).
            aggregation: how response-token losses become the mini-batch loss (as in SFTModule).
            max_grad_norm: clip the gradient norm (None: no clipping).
            val_group_size, val_greedy: responses per validation prompt and whether they are decoded greedily.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["policy", "optimizer", "lr_scheduler", "sampling"])
        self.automatic_optimization = False
        if group_size < 1 or epochs_per_round < 1:
            raise ValueError(f"group_size and epochs_per_round must be >= 1, got {group_size} and {epochs_per_round}")
        if max_per_prompt is not None and not 1 <= max_per_prompt <= group_size:
            raise ValueError(f"max_per_prompt must be in [1, group_size={group_size}] or null, got {max_per_prompt}")
        for name, value in (("mini_batch_size", mini_batch_size), ("micro_batch_size", micro_batch_size)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or null, got {value}")
        if mini_batch_size is not None and micro_batch_size is not None and mini_batch_size % micro_batch_size:
            raise ValueError(f"micro_batch_size={micro_batch_size} must divide mini_batch_size={mini_batch_size}")
        if aggregation not in AGGREGATION_MODES or aggregation == "seq-sum-constant":
            choices = [m for m in AGGREGATION_MODES if m != "seq-sum-constant"]
            raise ValueError(f"aggregation={aggregation!r} is not valid here; choose one of {choices}")
        self.policy = policy
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.group_size = group_size
        self.sampling = sampling or SamplingConfig()
        if not self.sampling.do_sample and group_size > 1:
            raise ValueError(
                "sampling.do_sample=false makes the group_size responses to a prompt identical (greedy); "
                "expert iteration needs sampled responses"
            )
        self.reward_threshold = reward_threshold
        self.max_per_prompt = max_per_prompt
        self.epochs_per_round = epochs_per_round
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.aggregation = aggregation
        self.max_grad_norm = max_grad_norm
        self.val_group_size = val_group_size
        self.val_greedy = val_greedy
        self.reward_callbacks: list[RewardCallback] = []

    validation_step = RLVRModule.validation_step
    configure_optimizers = RLVRModule.configure_optimizers

    def setup(self, stage: str) -> None:
        self.reward_callbacks = find_reward_callbacks(self.trainer.callbacks)
        if not self.reward_callbacks:
            raise ValueError("no RewardCallback in trainer.callbacks: expert iteration keeps what passes a reward")
        if self.reward_threshold is None and not any(cb.kind == "task" for cb in self.reward_callbacks):
            raise ValueError(
                "reward_threshold is null, so responses are kept when the task reward calls them correct, "
                "but no reward in trainer.callbacks has kind='task'; set reward_threshold"
            )

    # ---------------------------------------------------------------- a round

    def passing(self, rollout: Rollout) -> Tensor:
        """`bool[N]`: the responses to keep (before `max_per_prompt`)."""
        if self.reward_threshold is not None:
            return rollout.reward >= self.reward_threshold
        correct = self.correctness(rollout)
        if correct is None:
            raise ValueError(
                "reward_threshold is null but no task reward can tell a correct response "
                "(is_correct returned None); set reward_threshold"
            )
        return correct

    def keep_rows(self, rollout: Rollout, passing: Tensor) -> Tensor:
        """Row indices to fine-tune on: passing rows, at most `max_per_prompt` per prompt (the first ones sampled)."""
        if self.max_per_prompt is not None:
            grouped = passing.view(-1, self.group_size)
            rank = grouped.long().cumsum(dim=1)  # 1 for the first passing response of its prompt, ...
            passing = (grouped & (rank <= self.max_per_prompt)).view(-1)
        return passing.nonzero().squeeze(-1)

    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        started = clock(self.device)
        with gathered_params(self.policy):  # sharded (FSDP2): gathered once for the whole sampling call
            rollout = self.policy.sample(batch, self.group_size, self.sampling)
        self.score(rollout)
        passing = self.passing(rollout)
        rows = self.keep_rows(rollout, passing)
        sampled = clock(self.device)
        kept = rollout.select(rows)
        metrics: dict[str, Tensor | float] = {
            "train/reward_mean": rollout.reward.mean(),
            "train/pass_rate": passing.float().mean(),
            "train/prompts_solved": passing.view(-1, self.group_size).any(dim=1).float().mean(),
            "train/kept": float(kept.num_rows),
        }
        correct = self.correctness(rollout)
        if correct is not None:
            metrics["train/accuracy"] = correct.float().mean()
        metrics.update(self.per_reward_metrics(rollout, "train"))
        kept = self._pad_to_largest_rank(kept, rollout)
        if kept.num_rows == 0:
            log.warning("expert iteration round %d: no response passed; nothing to fine-tune on", batch_idx)
        else:
            metrics.update(self._fine_tune(kept))
        finished = clock(self.device)
        metrics["time/sampling_s"] = sampled - started
        metrics["time/update_s"] = finished - sampled
        metrics["time/step_s"] = finished - started
        publish_step_metrics(self, metrics, progress_bar={"kept": "train/kept", "pass": "train/pass_rate"})

    def _pad_to_largest_rank(self, kept: Rollout, rollout: Rollout) -> Rollout:
        """Ranks keep different numbers of rows, but must run the same number of forward and backward passes
        (DDP and FSDP reduce gradients at every backward). Pads `kept` to the largest count of any rank with
        copies of a sampled row whose response mask is zero: they weigh nothing in the loss."""
        if self.trainer.world_size <= 1:
            return kept
        counts = all_gather(self.trainer, torch.tensor([kept.num_rows], device=rollout.response_ids.device))
        missing = int(counts.max()) - kept.num_rows
        if missing == 0:
            return kept
        filler = rollout.select(torch.zeros(missing, dtype=torch.long, device=rollout.response_ids.device))
        filler.response_mask = torch.zeros_like(filler.response_mask)
        return Rollout.concat([kept, filler])

    def _fine_tune(self, kept: Rollout) -> dict[str, Tensor]:
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        mini_size = self.mini_batch_size or kept.num_rows
        losses, grad_norms = [], []
        for _ in range(self.epochs_per_round):
            order = torch.randperm(kept.num_rows, device=kept.response_ids.device)
            for start in range(0, kept.num_rows, mini_size):
                minibatch = kept.select(order[start : start + mini_size])
                num_tokens = minibatch.response_mask.sum()
                # rows padded in by _pad_to_largest_rank have no response token and do not count
                num_sequences = (minibatch.response_mask.sum(-1) > 0).sum().clamp(min=1)
                loss_sum = torch.zeros((), device=num_tokens.device)
                micros = list(self._micro_batches(minibatch))
                for i, micro in enumerate(micros):
                    loss = response_nll(
                        self.policy, micro, self.aggregation, num_sequences=num_sequences, num_tokens=num_tokens
                    )
                    with backward_sync(self, sync=i == len(micros) - 1):
                        self.manual_backward(loss)
                    loss_sum = loss_sum + loss.detach()
                grad_norms.append(policy_gradient_norm(self.policy, loss_sum.device))
                if self.max_grad_norm is not None:
                    self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
                losses.append(loss_sum)
        return {"train/loss": torch.stack(losses).mean(), "train/grad_norm": torch.stack(grad_norms).mean()}

    def _micro_batches(self, rollout: Rollout):
        size = self.micro_batch_size or rollout.num_rows
        for start in range(0, rollout.num_rows, size):
            yield rollout if size >= rollout.num_rows else rollout.select(slice(start, start + size))
