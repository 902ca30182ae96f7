"""`explain_reward_error`: a configuration mistake that only shows once training runs, as a `ConfigProblem`.

A reward that fails on every row of the first training step (`RewardFailedEveryRow`) is misconfigured (a
`score_row` with the wrong signature, a metadata key the data does not have), and so is one whose time limit
runs out on every row of a step (`RewardTimedOutEveryRow`): the message names the reward, its first failure
and where the reward is configured."""

from __future__ import annotations

from typing import Any

from rlvr_lightning.cli.errors.problem import ConfigProblem, config_path_of
from rlvr_lightning.rewards.base import RewardFailedEveryRow
from rlvr_lightning.runtime.config_locations import locate


def explain_reward_error(error: BaseException, argv: list[str], config: Any) -> ConfigProblem | None:
    if not isinstance(error, RewardFailedEveryRow):
        return None
    section, class_path = config_path_of(error.reward, config)
    where = locate(section, argv, value=class_path) if section else None
    tip = getattr(error, "tip", "the reward's on_error: raise stops at its first failure, with the traceback")
    return ConfigProblem(str(error), section, where, tip=tip)
