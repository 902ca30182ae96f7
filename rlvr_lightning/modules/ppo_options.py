"""`PPOModule`'s option groups: its critic (`value`) and GAE (`gae`), in the form of `modules/options.py`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from rlvr_lightning.modules.value_model import VALUE_MODELS
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import (
    NON_NEGATIVE_INT,
    PROBABILITY,
    OneOf,
    Range,
)


@documented_options
@dataclass(frozen=True)
class ValueConfig:
    """PPOModule's value model and its loss (`core/losses/value_loss.py`)."""

    model: Annotated[
        str,
        Option(
            "separate (a critic model of its own: `critic`, else a trainable copy of the policy, as verl "
            "initialises its critic from the actor) | shared (a value head on the policy's own hidden states).",
            OneOf(VALUE_MODELS),
        ),
    ] = "separate"
    lr: Annotated[
        float | None,
        Option(
            "learning rate of the critic's parameters (value head and separate trunk); null: the optimizer's.",
            Range(0, low_open=True, optional=True),
        ),
    ] = None
    coef: Annotated[
        float,
        Option(
            "weight of the value loss in the loss (TRL's vf_coef); > 0: the critic learns from the value loss.",
            Range(0, low_open=True),
        ),
    ] = 0.1
    clip: Annotated[
        float | None,
        Option(
            "how far a value may move from the rollout's value before its loss is clipped (TRL's cliprange_value "
            "0.2; verl's 0.5); null: the plain squared error.",
            Range(0, low_open=True, optional=True),
        ),
    ] = 0.2
    warmup_steps: Annotated[
        int,
        Option("rollout steps at the start in which only the critic learns (verl's critic_warmup).", NON_NEGATIVE_INT),
    ] = 0

    def __post_init__(self) -> None:
        check_options(ValueConfig, vars(self), "value.")


@documented_options
@dataclass(frozen=True)
class GAEConfig:
    """PPOModule's generalised advantage estimation (`core/gae.py`; Schulman et al. 2016)."""

    gamma: Annotated[float, Option("the discount (verl's default 1.0).", PROBABILITY)] = 1.0
    lam: Annotated[float, Option("GAE's lambda (verl's default 1.0; TRL uses 0.95).", PROBABILITY)] = 1.0
    whiten: Annotated[
        bool, Option("normalise the advantages to mean 0 and std 1 over the rollout's response tokens.")
    ] = True
    lam_critic: Annotated[
        float | None,
        Option(
            "the critic's targets' own lambda (VC-PPO's decoupled GAE: 1.0); null: the advantages'.",
            Range(0, 1, optional=True),
        ),
    ] = None
    length_adaptive_alpha: Annotated[
        float | None,
        Option(
            "VAPO: each response's lambda is 1 - 1/(alpha * its length), clipped to [0, 1] (0.05); null: lam.",
            Range(0, low_open=True, optional=True),
        ),
    ] = None

    def __post_init__(self) -> None:
        check_options(GAEConfig, vars(self), "gae.")
