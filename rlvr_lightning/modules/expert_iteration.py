"""`ExpertIterationModule`: sample, keep what passes the reward, fine-tune on it, repeat
(expert iteration / rejection-sampling fine-tuning: Anthony et al. 2017; STaR, Zelikman et
al. 2022; ReST-EM, Singh et al. 2023). `keep: all` is simple self-distillation (SSD, arXiv:2604.01193):
fine-tune on every non-empty response, unverified, sampled at a training temperature and truncation.

One training step is one round:

    1. rollout = policy.sample(prompts, n=group_size)          data.batch_size prompts, no grad
    2. rewards = the run's RewardCallbacks (trainer.callbacks)  as RLVRModule scores them (metrics only for `all`)
    3. keep    = responses the task reward calls correct, or whose total reward >= reward_threshold
                 (`all`: every response whose text is not empty); at most max_per_prompt per prompt
    4. update.epochs passes over the kept responses, in mini-batches of update.mini_batch_size rows:
           loss = negative log-likelihood of the response tokens (SFTModule's loss; `loss: dft`: DFT's)

so `trainer.limit_train_batches` is the number of rounds. A round sees `data.batch_size` prompts
(set it to the size of a finite prompt set to sample every prompt each round). Validation is
RLVRModule's (the same `val/accuracy`). Lightning's `global_step` counts optimizer steps.
"""

from __future__ import annotations

import logging
from typing import Annotated

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from rlvr_lightning.core.losses.likelihood import LIKELIHOOD_LOSSES
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.modules.options import UpdateConfig, ValidationConfig, plain_hyperparameters
from rlvr_lightning.modules.pair_rollouts import check_nll_aggregation, response_loss
from rlvr_lightning.modules.policy_module import PolicyModule
from rlvr_lightning.modules.step_metrics import publish_step_metrics
from rlvr_lightning.modules.update.gradients import backward_sync, policy_gradient_norm
from rlvr_lightning.modules.update.micro_batches import micro_batches, pack_sequences
from rlvr_lightning.parallel.fsdp import gathered_params
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.distributed import all_gather
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import POSITIVE_INT, OneOf, Range
from rlvr_lightning.runtime.timing import clock

log = logging.getLogger(__name__)

KEEP_CHOICES = ("passing", "all")


@documented_options
class ExpertIterationModule(PolicyModule):
    def __init__(
        self,
        policy: Annotated[Policy, Option("the model being trained (ToySortPolicy, HFPolicy, ...).")],
        optimizer: Annotated[
            OptimizerCallable, Option("the optimizer's class and options (class_path, init_args); default Adam.")
        ] = torch.optim.Adam,
        lr_scheduler: Annotated[
            LRSchedulerCallable | None,
            Option("a learning-rate scheduler, stepped with every optimizer step (null: none)."),
        ] = None,
        group_size: Annotated[int, Option("responses sampled per prompt in each round.", POSITIVE_INT)] = 8,
        sampling: Annotated[
            SamplingConfig | None, Option("how responses are sampled (temperature, max_new_tokens, ...).")
        ] = None,
        keep: Annotated[
            str,
            Option(
                "which responses a round fine-tunes on: passing (expert iteration: those the reward accepts, "
                "see reward_threshold) | all (SSD, simple self-distillation: every response whose text is not "
                "empty, unverified; rewards are then only logged and may be absent).",
                OneOf(KEEP_CHOICES),
            ),
        ] = "passing",
        reward_threshold: Annotated[
            float | None,
            Option(
                "keep responses whose weighted total reward is >= this; null keeps the ones the task "
                "reward's `is_correct` accepts (exact sort, verified answer, ...).",
                Range(optional=True),
            ),
        ] = None,
        max_per_prompt: Annotated[
            int | None,
            Option(
                "keep at most this many passing responses per prompt (null: all of them), so easy prompts "
                "do not crowd out hard ones.",
                Range(1, integer=True, optional=True),
            ),
        ] = None,
        update: Annotated[
            UpdateConfig,
            Option(
                "the fine-tuning of a round: epochs (passes over the kept responses), mini_batch_size and "
                "micro_batch_size (rows per optimizer step / backward pass; null: all kept rows / the whole"
                " mini-batch) or micro_batch_tokens (packed micro-batches of at most that many tokens), "
                "max_grad_norm (null: no clipping)."
            ),
        ] = UpdateConfig(epochs=2),
        aggregation: Annotated[
            AggregationConfig,
            Option(
                "how response-token losses become the mini-batch loss (mode as in SFTModule; responses "
                "without a token never count: count_empty_rows must stay false)."
            ),
        ] = AggregationConfig(mode="token-mean", count_empty_rows=False),
        validation: Annotated[
            ValidationConfig, Option("responses per validation prompt and greedy decoding (group_size, greedy).")
        ] = ValidationConfig(),
        loss: Annotated[
            str, Option("the per-token loss of the fine-tuning: nll | dft (as in SFTModule).", OneOf(LIKELIHOOD_LOSSES))
        ] = "nll",
    ) -> None:
        check_options(ExpertIterationModule, locals())
        super().__init__(policy, optimizer, lr_scheduler, sampling, validation)
        self.save_hyperparameters(ignore=["policy", "optimizer", "lr_scheduler", "sampling"])
        plain_hyperparameters(self)
        self.automatic_optimization = False
        check_round_options(keep, reward_threshold, max_per_prompt, group_size, self.sampling, update, aggregation)
        self.group_size = group_size
        self.keep, self.reward_threshold, self.max_per_prompt = keep, reward_threshold, max_per_prompt
        self.update, self.aggregation, self.loss = update, aggregation, loss
        if update.micro_batch_tokens is not None:
            pack_sequences(self.policy)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.keep == "all":
            return
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
        if self.keep == "all":
            return non_empty(rollout)
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
        if self.reward_callbacks:
            self.score(rollout)
        passing = self.passing(rollout)
        rows = self.keep_rows(rollout, passing)
        sampled = clock(self.device)
        kept = rollout.select(rows)
        metrics: dict[str, Tensor | float] = {"train/pass_rate": passing.float().mean()}
        metrics["train/kept"] = float(kept.num_rows)
        if self.keep == "passing":
            metrics["train/prompts_solved"] = passing.view(-1, self.group_size).any(dim=1).float().mean()
        if self.reward_callbacks:
            metrics["train/reward_mean"] = rollout.reward.mean()
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
        mini_size = self.update.mini_batch_size or kept.num_rows
        losses, grad_norms = [], []
        # the sampling forwards' casts carry no gradient; torch < 2.11 reuses them in grad mode (pytorch#112583)
        torch.clear_autocast_cache()
        for _ in range(self.update.epochs):
            order = torch.randperm(kept.num_rows, device=kept.response_ids.device)
            for start in range(0, kept.num_rows, mini_size):
                minibatch = kept.select(order[start : start + mini_size])
                num_tokens = minibatch.response_mask.sum()
                # rows padded in by _pad_to_largest_rank have no response token and do not count
                num_sequences = (minibatch.response_mask.sum(-1) > 0).sum().clamp(min=1)
                loss_sum = torch.zeros((), device=num_tokens.device)
                micros = list(self._micro_batches(minibatch))
                for i, micro in enumerate(micros):
                    loss = response_loss(
                        self.policy,
                        micro,
                        self.aggregation,
                        self.loss,
                        num_sequences=num_sequences,
                        num_tokens=num_tokens,
                    )
                    with backward_sync(self, sync=i == len(micros) - 1):
                        self.manual_backward(loss)
                    loss_sum = loss_sum + loss.detach()
                grad_norms.append(policy_gradient_norm(self.policy, loss_sum.device))
                if self.update.max_grad_norm is not None:
                    self.clip_gradients(
                        optimizer, gradient_clip_val=self.update.max_grad_norm, gradient_clip_algorithm="norm"
                    )
                optimizer.step()
                # an autocast opened with its cache (torch's default, Lightning's FSDPPrecision) keeps its casts of the
                # weights until it exits, after training_step: drop them, the next forward must cast the stepped weights
                torch.clear_autocast_cache()
                optimizer.zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
                losses.append(loss_sum)
        return {"train/loss": torch.stack(losses).mean(), "train/grad_norm": torch.stack(grad_norms).mean()}

    def _micro_batches(self, rollout: Rollout):
        return micro_batches(rollout, self.update)


def check_round_options(
    keep: str,
    reward_threshold: float | None,
    max_per_prompt: int | None,
    group_size: int,
    sampling: SamplingConfig,
    update: UpdateConfig,
    aggregation: AggregationConfig,
) -> None:
    """`ExpertIterationModule`'s checks of its options against each other, before anything is built."""
    if keep == "all" and reward_threshold is not None:
        raise ValueError(f"reward_threshold={reward_threshold} does not apply with keep='all' (nothing is checked)")
    if max_per_prompt is not None and not 1 <= max_per_prompt <= group_size:
        raise ValueError(f"max_per_prompt must be in [1, group_size={group_size}] or null, got {max_per_prompt}")
    if update.max_consecutive_skips != UpdateConfig.max_consecutive_skips:
        raise ValueError("update.max_consecutive_skips does not apply: expert iteration does not skip updates")
    if update.shuffle != "rows":
        raise ValueError("update.shuffle='prompts' does not apply: expert iteration keeps responses, not prompts")
    check_nll_aggregation(aggregation)
    if aggregation.count_empty_rows:
        raise ValueError(
            "aggregation.count_empty_rows=true does not apply: ranks are padded with empty rows, which never count"
        )
    if not sampling.do_sample and group_size > 1:
        raise ValueError(
            "sampling.do_sample=false makes the group_size responses to a prompt identical (greedy); "
            "expert iteration needs sampled responses"
        )


def non_empty(rollout: Rollout) -> Tensor:
    """`bool[N]`: responses with a response token and, where the policy decodes text, a text that is not blank
    (SSD's filter of empty completions: TRL `SSDTrainer._build_buffered_batch`)."""
    keep = rollout.response_mask.sum(dim=-1) > 0
    if rollout.response_text is not None:
        blank = torch.tensor([not text.strip() for text in rollout.response_text], device=keep.device)
        keep = keep & ~blank
    return keep
