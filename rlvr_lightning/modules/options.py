"""The training modules' options, grouped by concern: one frozen dataclass per group, each checking itself.

In a config each group is a mapping under its name (`kl: {coef: 0.04, estimator: k3}`); keys left out keep
the defaults shown here. Each option declares its help and domain beside it (`Annotated[int, Option(...)]`,
`runtime/option_declarations.py`); a group checks its options against each other in `__post_init__`, and the
checks that involve another group or a module argument are methods the module calls (`check_group_size`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from rlvr_lightning.core.importance_sampling import ROLLOUT_IS_MODES
from rlvr_lightning.core.kl import KLEstimator, kl_estimator
from rlvr_lightning.core.losses.policy_losses import PolicyLoss
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, POSITIVE_INT, OneOf, Range

log = logging.getLogger(__name__)

KL_MODES = ("loss", "reward")
SHUFFLES = ("rows", "prompts")


@documented_options
@dataclass(frozen=True)
class KLConfig:
    """The KL penalty to a reference policy (`core/kl.py`)."""

    coef: Annotated[float, Option("weight of the KL penalty; 0 means no reference model at all.", NON_NEGATIVE)] = 0.0
    estimator: Annotated[
        KLEstimator | str,
        Option(
            "k1 | k2 | k3 (Schulman 2020) | k3_is (k3 times pi_theta / pi_old, unbiased off-policy: "
            "DeepSeek-V3.2), or a KLEstimator (class_path and init_args)."
        ),
    ] = "k3"
    mode: Annotated[
        str,
        Option(
            "loss (coef * KL added to the per-token loss, GRPO) | reward (coef * sum_t KL_t subtracted from each "
            "response's reward before advantages, PPO-style reward shaping).",
            OneOf(KL_MODES),
        ),
    ] = "loss"
    clamp: Annotated[
        float | None,
        Option(
            "clamp each token's estimate to [-clamp, clamp] (verl's low_var_kl: 10; null: no clamp).",
            Range(0, low_open=True, optional=True),
        ),
    ] = None
    refresh_every: Annotated[
        int | None,
        Option(
            "refresh the reference from the policy every this many rollout steps (null: never).",
            Range(1, integer=True, optional=True),
        ),
    ] = None
    mixup_alpha: Annotated[
        float,
        Option(
            "a refresh sets ref = alpha * policy + (1 - alpha) * ref (1: copy; < 1: TR-DPO mixup).",
            Range(0, 1, low_open=True),
        ),
    ] = 1.0
    reset_optimizer: Annotated[
        bool, Option("at each refresh the optimizer also forgets its state for the policy (ProRL's reset).")
    ] = False

    def __post_init__(self) -> None:
        kl_estimator(self.estimator, "kl.estimator")
        check_options(KLConfig, vars(self), "kl.")
        if self.mode == "reward" and self.coef == 0:
            raise ValueError("kl.mode='reward' shapes the reward by kl.coef * KL, but kl.coef=0")
        if self.mixup_alpha != 1 and not self.refresh_every:
            raise ValueError("kl.mixup_alpha sets how the reference is refreshed, but kl.refresh_every is not set")
        if self.reset_optimizer and not self.refresh_every:
            raise ValueError(
                "kl.reset_optimizer resets the optimizer at each reference refresh, but kl.refresh_every is not set"
            )
        if self.refresh_every and self.coef == 0:
            raise ValueError("kl.refresh_every refreshes the KL reference, but kl.coef=0 means there is no reference")


@documented_options
@dataclass(frozen=True)
class ImportanceSamplingConfig:
    """Correction of the sampler/trainer mismatch and of off-policy samples (`core/importance_sampling.py`)."""

    mode: Annotated[
        str | None,
        Option(
            "token_truncate | token_mask | sequence_truncate | sequence_mask, or null (no correction; with "
            "rollout_staleness >= 1: token_mask). Yao et al. 2025.",
            OneOf(ROLLOUT_IS_MODES, optional=True),
        ),
    ] = None
    max: Annotated[
        float,
        Option(
            "the weights' cap C (truncate) or the upper end of the band outside which weights are 0 (mask).",
            Range(0, low_open=True),
        ),
    ] = 2.0
    min: Annotated[
        float | None,
        Option("the lower end of that band, or the truncation's floor (null: none).", Range(0, optional=True)),
    ] = None
    off_policy_mask_threshold: Annotated[
        float | None,
        Option(
            "DeepSeek-V3.2's off-policy sequence masking: a response with a negative advantage whose mean "
            "log(pi_sampler / pi_theta) over its tokens exceeds this leaves the policy loss (the sampler's "
            "log-probs where the policy records them, else the old ones; null: no masking).",
            Range(0, optional=True),
        ),
    ] = None

    def __post_init__(self) -> None:
        check_options(ImportanceSamplingConfig, vars(self), "rollout_is.")
        if self.min is not None and not self.min < self.max:
            raise ValueError(f"need 0 <= rollout_is.min < rollout_is.max, got {self.min} and {self.max}")

    def with_staleness(self, rollout_staleness: int) -> ImportanceSamplingConfig:
        """These options for a run whose rollouts are `rollout_staleness` updates old: with stale rollouts and no mode
        named, `token_mask` (AReaL: tokens whose weight is over the cap drop out)."""
        if rollout_staleness and self.mode is None:
            return dataclasses.replace(self, mode="token_mask")
        return self


@documented_options
@dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO's dynamic sampling: drop groups whose rewards all agree and top the batch up with fresh prompts."""

    enabled: Annotated[bool, Option("whether to drop and top up.")] = False
    max_rounds: Annotated[
        int,
        Option(
            "generation rounds per step at most; a batch still short is filled with dropped groups (advantage 0), "
            "so every update has the same size.",
            POSITIVE_INT,
        ),
    ] = 4

    def __post_init__(self) -> None:
        check_options(DynamicSamplingConfig, vars(self), "dynamic_sampling.")
        if self.enabled and self.max_rounds < 2:
            raise ValueError(
                f"dynamic_sampling.max_rounds={self.max_rounds}: dynamic sampling needs >= 2 rounds "
                "(with one it could only reorder the batch)"
            )

    def check_group_size(self, group_size: int, name: str = "group_size") -> None:
        if self.enabled and group_size < 2:
            raise ValueError(
                f"dynamic_sampling drops groups whose rewards all agree; with {name}=1 every group agrees "
                f"with itself, so nothing could be trained on. Use {name} >= 2."
            )


@documented_options
@dataclass(frozen=True)
class ReplayConfig:
    """A replay buffer of informative groups (TRL's `GRPOWithReplayBufferTrainer`; `modules/replay_buffer.py`)."""

    size: Annotated[
        int,
        Option(
            "groups kept (0: no replay). Each step, groups whose rewards differ enter it, scored sum |A| x reward "
            "std, and groups whose rewards all agree are replaced by groups drawn from it by score.",
            Range(0, integer=True),
        ),
    ] = 0
    max_age: Annotated[
        int | None,
        Option(
            "rollout steps a group may stay in the buffer (null: until outscored, as TRL keeps it).",
            Range(0, integer=True, optional=True),
        ),
    ] = None

    def __post_init__(self) -> None:
        check_options(ReplayConfig, vars(self), "replay.")

    def check_group_size(self, group_size: int, name: str = "group_size") -> None:
        if self.size and group_size < 2:
            raise ValueError(f"replay replaces groups whose rewards all agree; with {name}=1 every group does")


@documented_options
@dataclass(frozen=True)
class UpdateConfig:
    """The inner update over one rollout: epochs x mini-batches x micro-batches."""

    epochs: Annotated[int, Option("passes over the rollout (PPO epochs).", POSITIVE_INT)] = 1
    mini_batch_size: Annotated[
        int | None,
        Option(
            "rows (completions) per optimizer step (null: the whole rollout).", Range(1, integer=True, optional=True)
        ),
    ] = None
    micro_batch_size: Annotated[
        int | None,
        Option(
            "rows per backward pass (null: the whole mini-batch); must divide mini_batch_size.",
            Range(1, integer=True, optional=True),
        ),
    ] = None
    micro_batch_tokens: Annotated[
        int | None,
        Option(
            "instead of rows, micro-batches of at most this many tokens (prompt + response per row), each scored "
            "padding-free as one packed sequence, in every pass over the completions (old, reference and teacher "
            "log-probs, PPO's values, the update); at least the longest row. Null: row micro-batches "
            "(`micro_batch_size`).",
            Range(1, integer=True, optional=True),
        ),
    ] = None
    shuffle: Annotated[
        Literal["rows", "prompts"],
        Option(
            "how the rollout is dealt into mini-batches: rows (each response on its own, TRL and verl) or prompts "
            "(whole prompt groups, in random order: every mini-batch holds all the responses of its prompts, as "
            "prompt-mean-token-mean assumes; mini_batch_size a multiple of group_size).",
            OneOf(SHUFFLES),
        ),
    ] = "rows"
    max_grad_norm: Annotated[
        float | None,
        Option("clip the gradient norm to this (null: no clipping).", Range(0, low_open=True, optional=True)),
    ] = 1.0
    max_consecutive_skips: Annotated[
        int,
        Option("stop after this many consecutive updates with a non-finite loss or gradient.", POSITIVE_INT),
    ] = 10

    def __post_init__(self) -> None:
        check_options(UpdateConfig, vars(self), "update.")
        if (
            self.mini_batch_size is not None
            and self.micro_batch_size is not None
            and self.mini_batch_size % self.micro_batch_size
        ):
            raise ValueError(
                f"update.micro_batch_size={self.micro_batch_size} must divide update.mini_batch_size="
                f"{self.mini_batch_size} (a mini-batch is accumulated from whole micro-batches)"
            )
        if self.micro_batch_size is not None and self.micro_batch_tokens is not None:
            raise ValueError(
                f"update.micro_batch_size={self.micro_batch_size} and update.micro_batch_tokens="
                f"{self.micro_batch_tokens} both size the micro-batches; set one of them (the other null)"
            )

    def check_group_size(self, group_size: int, name: str = "group_size") -> None:
        if self.shuffle == "prompts" and self.mini_batch_size is not None and self.mini_batch_size % group_size:
            raise ValueError(
                f"update.shuffle='prompts' deals whole prompt groups into mini-batches, so update.mini_batch_size="
                f"{self.mini_batch_size} must be a multiple of {name}={group_size}"
            )

    def check_whole_groups(self, loss: PolicyLoss, group_size: int, name: str = "group_size") -> None:
        """A loss that `reads_groups` needs each group's rows in one micro-batch."""
        sizes = (self.mini_batch_size or 0, self.micro_batch_size or 0)
        cut = self.micro_batch_tokens or (self.shuffle == "rows" and sizes[0]) or any(s % group_size for s in sizes)
        if loss.reads_groups and cut:
            raise ValueError(
                f"{type(loss).__name__} reads whole prompt groups in each micro-batch: set update.shuffle: prompts, "
                f"update.mini_batch_size and micro_batch_size multiples of {name}={group_size}, micro_batch_tokens null"
            )

    def warn_stale_epochs(self, loss: PolicyLoss) -> None:
        if not loss.needs_old_log_probs and self.epochs > 1:
            log.warning(
                "loss %r reads no old log-probs (no importance ratio): epochs after the first train on stale "
                "samples uncorrected",
                loss,
            )


@documented_options
@dataclass(frozen=True)
class ValidationConfig:
    """How held-out prompts are answered in validation (and by `rlvr predict`)."""

    group_size: Annotated[int, Option("responses per prompt (pass@k and majority vote need > 1).", POSITIVE_INT)] = 1
    greedy: Annotated[
        bool, Option("decode greedily (only with group_size 1: greedy responses to a prompt are identical).")
    ] = True
    pass_at_k: Annotated[
        list[int] | None, Option("the k of the logged val/pass@k, each in [1, group_size] (null: group_size).")
    ] = None

    def __post_init__(self) -> None:
        check_options(ValidationConfig, vars(self), "validation.")
        if self.greedy and self.group_size > 1:
            raise ValueError(
                f"validation.greedy decodes the {self.group_size} validation responses of a prompt identically; "
                "set validation.greedy: false to measure pass@k and majority vote"
            )
        if self.pass_at_k is not None and (
            not self.pass_at_k or any(isinstance(k, bool) or not 1 <= k <= self.group_size for k in self.pass_at_k)
        ):
            raise ValueError(
                f"validation.pass_at_k={self.pass_at_k} is not valid: each k must be in [1, "
                f"validation.group_size={self.group_size}] (the unbiased estimator draws k of the group's responses)"
            )


def check_option_groups(
    loss: PolicyLoss,
    sampling: SamplingConfig,
    group_size: int,
    trained_group_size: int,
    dynamic_sampling: DynamicSamplingConfig,
    update: UpdateConfig,
    replay: ReplayConfig,
    aggregation: AggregationConfig,
) -> None:
    """`RLVRModule`'s checks between its option groups, its group sizes (sampled, and trained: `group_filter.keep`)
    and its loss, before anything is built."""
    sampling.check_group_size(group_size)
    trained = "group_size" if trained_group_size == group_size else "group_filter.keep"
    dynamic_sampling.check_group_size(trained_group_size, trained)
    replay.check_group_size(trained_group_size, trained)
    update.check_group_size(trained_group_size, trained)
    update.check_whole_groups(loss, trained_group_size, trained)
    loss.check(aggregation.mode)
    update.warn_stale_epochs(loss)


def check_rollout_staleness(rollout_staleness: Any) -> None:
    if isinstance(rollout_staleness, bool) or not isinstance(rollout_staleness, int) or rollout_staleness < 0:
        raise ValueError(
            f"rollout_staleness={rollout_staleness!r} is not valid; choose an integer K >= 0 (0: on-policy, "
            "K: rollouts sampled up to K updates before the one that trains on them)"
        )


def plain(value: Any) -> Any:
    """An option as plain data: option groups as dicts, losses and KL estimators as their class_path and init_args
    (checkpoints keep their hyper-parameters so, and load with `torch.load(weights_only=True)`)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, (PolicyLoss, KLEstimator)):  # an underscored attribute is built state, not an option
        init_args = {key: plain(item) for key, item in vars(value).items() if not key.startswith("_")}
        return {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": init_args}
    return value


def plain_hyperparameters(module) -> None:
    """Replace the option objects among `module.hparams` (set by `save_hyperparameters`) with plain data."""
    for key, value in list(module.hparams.items()):
        module.hparams[key] = plain(value)
