"""One module base, and the inner update as an object the RL module owns."""

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.modules import ExpertIterationModule, PolicyModule, PPOModule, RLVRModule, SFTModule
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.modules.update.value_update import ValueUpdate
from rlvr_lightning.policies.toy_sort import ToySortPolicy


def toy():
    torch.manual_seed(0)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)


@pytest.mark.parametrize("module_class", [RLVRModule, SFTModule, ExpertIterationModule])
def test_every_module_extends_the_base_alone(module_class):
    assert module_class.__bases__ == (PolicyModule,)
    assert PolicyModule.__bases__ == (pl.LightningModule,)
    assert PPOModule.__bases__ == (RLVRModule,)


def test_the_rl_modules_own_their_update():
    assert type(RLVRModule(toy(), group_size=2).policy_update) is PolicyUpdate
    ppo = PPOModule(toy(), group_size=2)
    assert type(ppo.policy_update) is ValueUpdate
    assert ppo.policy_update.value_head is ppo.value_head and ppo.policy_update.critic is ppo.critic
    assert ppo.policy_update.reference is ppo.reference


def test_the_skip_counters_travel_in_the_checkpoint_under_their_old_key():
    module = RLVRModule(toy(), group_size=2, update=UpdateConfig(max_consecutive_skips=5))
    module.policy_update.skipped_updates, module.policy_update.consecutive_skips = 4, 2
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["rlvr_counters"] == {"skipped_updates": 4, "consecutive_skips": 2}
    resumed = RLVRModule(toy(), group_size=2)
    resumed.on_load_checkpoint(checkpoint)
    assert (resumed.policy_update.skipped_updates, resumed.policy_update.consecutive_skips) == (4, 2)
    resumed.on_load_checkpoint({})  # a checkpoint written before the counters existed
    assert (resumed.policy_update.skipped_updates, resumed.policy_update.consecutive_skips) == (0, 0)
