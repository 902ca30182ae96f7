"""W-REINFORCE in a run: its advantages come from the task reward's ``is_correct``; a run without one is refused."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages import WeightedReinforceAdvantage
from rlvr_lightning.modules import RLVRModule

from .test_algorithm_options import Constant
from .test_positive_nll import FirstTokenEven
from .test_rlvr_module import fit, policy


def test_a_run_reads_correctness_from_the_task_reward(in_tmp_dir):
    module = RLVRModule(policy(), group_size=2, loss="ppo_clip")
    fit(module, [FirstTokenEven(), WeightedReinforceAdvantage(positive_weight=0.25)], steps=1, batch_size=8)
    rollout = module.last_rollout
    even = rollout.response_ids[:, 0] % 2 == 0
    assert bool(even.any()) and not bool(even.all())
    assert_close(rollout.advantages, torch.where(even, 0.25, -1.0))


def test_a_reward_that_cannot_tell_correctness_is_refused(in_tmp_dir):
    module = RLVRModule(policy(), group_size=2)
    with pytest.raises(ValueError, match="WeightedReinforceAdvantage trains on which responses are correct"):
        fit(module, [Constant(), WeightedReinforceAdvantage()], steps=1)
    with pytest.raises(ValueError, match=r"positive_weight=-0.1 is not valid: must be a finite number >= 0"):
        WeightedReinforceAdvantage(positive_weight=-0.1)
