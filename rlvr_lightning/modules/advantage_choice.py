"""Which `AdvantageCallback` an `RLVRModule` run uses, and the checks between it and the module's options."""

from __future__ import annotations

import logging

from rlvr_lightning.advantages import AdvantageCallback, GroupNormalizedAdvantage
from rlvr_lightning.policies.base import Policy

log = logging.getLogger(__name__)


def choose_advantage_estimator(module, estimators: list[AdvantageCallback]) -> AdvantageCallback:
    """Exactly one of `estimators` (the `AdvantageCallback`s among `trainer.callbacks`), GRPO's when there is none,
    checked against the groups it sees, the policy and the ways the trained rollout may differ from the step's
    batch."""
    if len(estimators) > 1:
        raise ValueError(
            f"exactly one AdvantageCallback per run, got {len(estimators)}: "
            + ", ".join(type(cb).__name__ for cb in estimators)
        )
    if estimators:
        estimator = estimators[0]
    else:
        estimator = GroupNormalizedAdvantage()
        log.warning("no AdvantageCallback configured: using GRPO's group-normalised advantage")
        if module.trainer.is_global_zero:
            print("rlvr: no AdvantageCallback configured, using GroupNormalizedAdvantage (GRPO)")
    name = type(estimator).__name__
    trained, keep = module.trained_group_size, module.group_filter.keep
    if keep is not None and keep < estimator.min_group_size:
        raise ValueError(
            f"{name} needs groups of >= {estimator.min_group_size} responses (it compares responses to the same "
            f"prompt), but group_filter.keep={keep} trains on {keep} per prompt"
        )
    estimator.check_group_size(trained)
    if estimator.reads_token_energy and type(module.policy).logit_statistics is Policy.logit_statistics:
        raise ValueError(
            f"{name} reads each token's energy, which {type(module.policy).__name__} does not compute: "
            "implement Policy.logit_statistics"
        )
    reads_batch = estimator.reads_step_batch
    if reads_batch and (module.dynamic_sampling.enabled or module.rollout_staleness):
        option = "dynamic_sampling.enabled=true" if module.dynamic_sampling.enabled else "rollout_staleness >= 1"
        raise ValueError(
            f"{name} {reads_batch}, but with {option} the trained rollout holds other prompts; use one without "
            "the other"
        )
    return estimator
