"""The training modules' options, grouped by concern: one frozen dataclass per group, each checking itself.

In a config each group is a mapping under its name (`kl: {coef: 0.04, estimator: k3}`); keys left out keep
the defaults shown here. Checks that involve several groups are in `check_rl_options`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from rlvr_lightning.core.aggregation import AGGREGATION_MODES
from rlvr_lightning.core.importance_sampling import ROLLOUT_IS_MODES
from rlvr_lightning.core.kl import KLEstimator, kl_estimator
from rlvr_lightning.core.losses.policy_losses import PolicyLoss
from rlvr_lightning.modules.value_model import VALUE_MODELS
from rlvr_lightning.runtime.option_domains import (
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    PROBABILITY,
    Range,
    check_ranges,
)

log = logging.getLogger(__name__)

KL_MODES = ("loss", "reward")


def _choice(option: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{option}={value!r} is not valid; choose one of {list(choices)}")


def _check_ranges(group: Any, name: str) -> None:
    """The option group `group` (a dataclass with `OPTION_RANGES`), named `name` in the module's options."""
    check_ranges(group.OPTION_RANGES, vars(group), prefix=f"{name}.")


@dataclass(frozen=True)
class AggregationConfig:
    """How per-token losses become the scalar that is back-propagated (`core/aggregation.py`).

    Args:
        mode: seq-mean-token-mean (GRPO) | token-mean (DAPO) | seq-mean-token-sum | seq-sum-constant (Dr. GRPO).
        constant: the divisor of seq-sum-constant (null: the policy's fixed response_length if it has one, else
            sampling.max_new_tokens).
        count_empty_rows: whether responses without a token count in the seq-mean modes' divisor (verl: false).
    """

    mode: str = "seq-mean-token-mean"
    constant: float | None = None
    count_empty_rows: bool = True

    OPTION_RANGES: ClassVar[dict[str, Range]] = {"constant": Range(0, low_open=True, optional=True)}

    def __post_init__(self) -> None:
        _choice("aggregation.mode", self.mode, AGGREGATION_MODES)
        _check_ranges(self, "aggregation")
        if self.constant is not None and self.mode != "seq-sum-constant":
            raise ValueError(f"aggregation.constant is the divisor of mode 'seq-sum-constant', not of {self.mode!r}")


@dataclass(frozen=True)
class KLConfig:
    """The KL penalty to a reference policy (`core/kl.py`).

    Args:
        coef: weight of the KL penalty; 0 means no reference model at all.
        estimator: k1 | k2 | k3 (Schulman 2020) | k3_is (k3 times pi_theta / pi_old, unbiased off-policy:
            DeepSeek-V3.2), or a KLEstimator (class_path and init_args).
        mode: loss (coef * KL added to the per-token loss, GRPO) | reward (coef * sum_t KL_t subtracted from each
            response's reward before advantages, PPO-style reward shaping).
        clamp: clamp each token's estimate to [-clamp, clamp] (verl's low_var_kl: 10; null: no clamp).
        refresh_every: refresh the reference from the policy every this many rollout steps (null: never).
        mixup_alpha: a refresh sets ref = alpha * policy + (1 - alpha) * ref (1: copy; < 1: TR-DPO mixup).
    """

    coef: float = 0.0
    estimator: KLEstimator | str = "k3"
    mode: str = "loss"
    clamp: float | None = None
    refresh_every: int | None = None
    mixup_alpha: float = 1.0

    OPTION_RANGES: ClassVar[dict[str, Range]] = {
        "coef": NON_NEGATIVE,
        "clamp": Range(0, low_open=True, optional=True),
        "refresh_every": Range(1, integer=True, optional=True),
        "mixup_alpha": Range(0, 1, low_open=True),
    }

    def __post_init__(self) -> None:
        kl_estimator(self.estimator, "kl.estimator")
        _choice("kl.mode", self.mode, KL_MODES)
        _check_ranges(self, "kl")
        if self.mode == "reward" and self.coef == 0:
            raise ValueError("kl.mode='reward' shapes the reward by kl.coef * KL, but kl.coef=0")
        if self.mixup_alpha != 1 and not self.refresh_every:
            raise ValueError("kl.mixup_alpha sets how the reference is refreshed, but kl.refresh_every is not set")
        if self.refresh_every and self.coef == 0:
            raise ValueError("kl.refresh_every refreshes the KL reference, but kl.coef=0 means there is no reference")


@dataclass(frozen=True)
class ImportanceSamplingConfig:
    """Correction of the sampler/trainer mismatch and of off-policy samples (`core/importance_sampling.py`).

    Args:
        mode: token_truncate | token_mask | sequence_truncate | sequence_mask, or null (no correction; with
            rollout_staleness >= 1: token_mask). Yao et al. 2025.
        max: the weights' cap C (truncate) or the upper end of the band outside which weights are 0 (mask).
        min: the lower end of that band, or the truncation's floor (null: none).
        off_policy_mask_threshold: DeepSeek-V3.2's off-policy sequence masking: a response with a negative
            advantage whose mean log(pi_sampler / pi_theta) over its tokens exceeds this leaves the policy loss
            (the sampler's log-probs where the policy records them, else the old ones; null: no masking).
    """

    mode: str | None = None
    max: float = 2.0
    min: float | None = None
    off_policy_mask_threshold: float | None = None

    OPTION_RANGES: ClassVar[dict[str, Range]] = {
        "max": Range(0, low_open=True),
        "min": Range(0, optional=True),
        "off_policy_mask_threshold": Range(0, optional=True),
    }

    def __post_init__(self) -> None:
        if self.mode is not None:
            _choice("rollout_is.mode", self.mode, ROLLOUT_IS_MODES)
        _check_ranges(self, "rollout_is")
        if self.max <= 0 or (self.min is not None and not 0 <= self.min < self.max):
            raise ValueError(f"need 0 <= rollout_is.min < rollout_is.max, got {self.min} and {self.max}")


@dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO's dynamic sampling: drop groups whose rewards all agree and top the batch up with fresh prompts.

    Args:
        enabled: whether to drop and top up.
        max_rounds: generation rounds per step at most; a batch still short is filled with dropped groups
            (advantage 0), so every update has the same size.
    """

    enabled: bool = False
    max_rounds: int = 4

    OPTION_RANGES: ClassVar[dict[str, Range]] = {"max_rounds": POSITIVE_INT}

    def __post_init__(self) -> None:
        _check_ranges(self, "dynamic_sampling")
        if self.max_rounds < 1 or (self.enabled and self.max_rounds < 2):
            raise ValueError(
                f"dynamic_sampling.max_rounds={self.max_rounds}: dynamic sampling needs >= 2 rounds "
                "(with one it could only reorder the batch)"
            )


@dataclass(frozen=True)
class UpdateConfig:
    """The inner update over one rollout: epochs x mini-batches x micro-batches.

    Args:
        epochs: passes over the rollout (PPO epochs).
        mini_batch_size: rows (completions) per optimizer step (null: the whole rollout).
        micro_batch_size: rows per backward pass (null: the whole mini-batch); must divide mini_batch_size.
        micro_batch_tokens: instead of rows, micro-batches of at most this many tokens (prompt + response per
            row), each scored padding-free as one packed sequence, in every pass over the completions (old,
            reference and teacher log-probs, PPO's values, the update); at least the longest row. Null: row
            micro-batches (`micro_batch_size`).
        max_grad_norm: clip the gradient norm to this (null: no clipping).
        max_consecutive_skips: stop after this many consecutive updates with a non-finite loss or gradient.
    """

    epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    max_grad_norm: float | None = 1.0
    max_consecutive_skips: int = 10

    OPTION_RANGES: ClassVar[dict[str, Range]] = {
        "epochs": POSITIVE_INT,
        "mini_batch_size": Range(1, integer=True, optional=True),
        "micro_batch_size": Range(1, integer=True, optional=True),
        "micro_batch_tokens": Range(1, integer=True, optional=True),
        "max_grad_norm": Range(0, low_open=True, optional=True),
        "max_consecutive_skips": POSITIVE_INT,
    }

    def __post_init__(self) -> None:
        _check_ranges(self, "update")
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


@dataclass(frozen=True)
class ValidationConfig:
    """How held-out prompts are answered in validation (and by `rlvr predict`).

    Args:
        group_size: responses per prompt (pass@k and majority vote need > 1).
        greedy: decode greedily (only with group_size 1: greedy responses to a prompt are identical).
    """

    group_size: int = 1
    greedy: bool = True

    OPTION_RANGES: ClassVar[dict[str, Range]] = {"group_size": POSITIVE_INT}

    def __post_init__(self) -> None:
        _check_ranges(self, "validation")
        if self.greedy and self.group_size > 1:
            raise ValueError(
                f"validation.greedy decodes the {self.group_size} validation responses of a prompt identically; "
                "set validation.greedy: false to measure pass@k and majority vote"
            )


@dataclass(frozen=True)
class ValueConfig:
    """PPOModule's value model and its loss (`core/losses/value_loss.py`).

    Args:
        model: separate (a critic model of its own: `critic`, else a trainable copy of the policy, as verl
            initialises its critic from the actor) | shared (a value head on the policy's own hidden states).
        lr: learning rate of the critic's parameters (value head and separate trunk); null: the optimizer's.
        coef: weight of the value loss in the loss (TRL's vf_coef).
        clip: how far a value may move from the rollout's value before its loss is clipped (TRL's cliprange_value
            0.2; verl's 0.5); null: the plain squared error.
        warmup_steps: rollout steps at the start in which only the critic learns (verl's critic_warmup).
    """

    model: str = "separate"
    lr: float | None = None
    coef: float = 0.1
    clip: float | None = 0.2
    warmup_steps: int = 0

    OPTION_RANGES: ClassVar[dict[str, Range]] = {
        "lr": Range(0, low_open=True, optional=True),
        "coef": Range(0, low_open=True),  # the critic learns from the value loss
        "clip": Range(0, low_open=True, optional=True),
        "warmup_steps": NON_NEGATIVE_INT,
    }

    def __post_init__(self) -> None:
        _choice("value.model", self.model, VALUE_MODELS)
        _check_ranges(self, "value")


@dataclass(frozen=True)
class GAEConfig:
    """PPOModule's generalised advantage estimation (`core/gae.py`; Schulman et al. 2016).

    Args:
        gamma: the discount (verl's default 1.0).
        lam: GAE's lambda (verl's default 1.0; TRL uses 0.95).
        whiten: normalise the advantages to mean 0 and std 1 over the rollout's response tokens.
    """

    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = True

    OPTION_RANGES: ClassVar[dict[str, Range]] = {"gamma": PROBABILITY, "lam": PROBABILITY}

    def __post_init__(self) -> None:
        _check_ranges(self, "gae")


def check_rl_options(
    group_size: int,
    sampling,
    loss,
    aggregation: AggregationConfig,
    rollout_staleness: int,
    dynamic_sampling: DynamicSamplingConfig,
    update: UpdateConfig,
) -> None:
    """The checks of `RLVRModule`'s options that involve more than one group (`loss` is a `PolicyLoss`)."""
    if not sampling.do_sample and group_size > 1:
        raise ValueError(
            f"sampling.do_sample=false decodes greedily: the {group_size} responses of a group would be identical "
            "and every group-relative advantage 0. Sample (do_sample: true) or use group_size: 1."
        )
    if dynamic_sampling.enabled and group_size < 2:
        raise ValueError(
            "dynamic_sampling drops groups whose rewards all agree; with group_size=1 every group agrees "
            "with itself, so nothing could be trained on. Use group_size >= 2."
        )
    if isinstance(rollout_staleness, bool) or not isinstance(rollout_staleness, int) or rollout_staleness < 0:
        raise ValueError(
            f"rollout_staleness={rollout_staleness!r} is not valid; choose an integer K >= 0 (0: on-policy, "
            "K: rollouts sampled up to K updates before the one that trains on them)"
        )
    loss.check(aggregation.mode)
    if not loss.needs_old_log_probs and update.epochs > 1:
        log.warning(
            "loss %r reads no old log-probs (no importance ratio): epochs after the first train on stale samples "
            "uncorrected",
            loss,
        )


def plain(value: Any) -> Any:
    """An option as plain data: option groups as dicts, losses and KL estimators as their class_path and init_args
    (checkpoints keep their hyper-parameters so, and load with `torch.load(weights_only=True)`)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, (PolicyLoss, KLEstimator)):
        init_args = {key: plain(item) for key, item in vars(value).items()}
        return {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": init_args}
    return value


def plain_hyperparameters(module) -> None:
    """Replace the option objects among `module.hparams` (set by `save_hyperparameters`) with plain data."""
    for key, value in list(module.hparams.items()):
        module.hparams[key] = plain(value)
