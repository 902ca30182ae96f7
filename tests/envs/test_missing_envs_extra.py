"""Without the `envs` extra, the environments say how to install it (no traceback into the import machinery)."""

from __future__ import annotations

import sys

import pytest

from rlvr_lightning.runtime.optional_dependencies import MissingDependencyError, require


@pytest.mark.parametrize("module", ["reasoning_gym", "verifiers"])
def test_a_missing_package_names_the_install_command(module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as when it is not installed
    with pytest.raises(MissingDependencyError) as error:
        require(module, "this feature")
    assert str(error.value) == f"this feature needs the package '{module}': pip install 'rlvr-lightning[envs]'"


def test_the_task_and_reward_fail_at_construction(monkeypatch):
    from rlvr_lightning.data.reasoning_gym_task import ReasoningGymTask
    from rlvr_lightning.rewards.reasoning_gym import ReasoningGymReward

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(MissingDependencyError, match=r"ReasoningGymTask needs .*rlvr-lightning\[envs\]"):
        ReasoningGymTask(datasets=["leg_counting"])
    with pytest.raises(MissingDependencyError, match=r"ReasoningGymReward needs .*rlvr-lightning\[envs\]"):
        ReasoningGymReward()
