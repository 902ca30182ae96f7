"""`SandboxLimits`: one set of limits for every sandboxed run, checked where it is built."""

import pytest

from rlvr_lightning.grading.sandbox_limits import SandboxLimits
from rlvr_lightning.rewards.code import CodeExecutionReward
from rlvr_lightning.tools.python import PythonTool


@pytest.mark.parametrize(
    "option, value",
    [
        ("timeout_s", 0),
        ("timeout_s", -1.0),
        ("memory_mb", 0),
        ("cpu_s", 1.5),
        ("max_processes", True),
        ("max_file_mb", "1"),
    ],
)
def test_a_bad_limit_is_refused_naming_it(option, value):
    with pytest.raises(ValueError, match=rf"sandbox limit {option} must be .*got {value!r}"):
        SandboxLimits(**{option: value})


def test_the_tool_and_the_reward_check_their_limits_when_built():
    with pytest.raises(ValueError, match="sandbox limit memory_mb"):
        PythonTool(memory_mb=0)
    with pytest.raises(ValueError, match="sandbox limit timeout_s"):
        CodeExecutionReward(timeout_s=0)
    assert PythonTool(timeout_s=2.0).limits == SandboxLimits(timeout_s=2.0)
