"""SFTModule with `loss: dft` trains on DFT's loss and still validates on the plain NLL."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.modules.pair_rollouts import pair_rollout, response_nll
from rlvr_lightning.modules.sft import SFTModule

from .test_sft import toy


def test_the_training_loss_is_dft_by_hand():
    policy = toy()
    prompts, responses = [[3, 1, 2], [0, 4, 4]], [[1, 2, 3], [0, 4, 4]]
    module = SFTModule(policy, loss="dft")
    module.log = module.log_dict = lambda *args, **kwargs: None
    loss = module.training_step({"prompt": prompts, "response": responses}, 0)
    log_probs = torch.log_softmax(policy(torch.tensor(prompts)), -1).gather(-1, torch.tensor(responses)[..., None])
    assert_close(loss, (-log_probs.exp() * log_probs).mean())
    assert not torch.allclose(loss, response_nll(policy, pair_rollout(policy, prompts, responses)))


def test_a_wrong_loss_names_the_choices():
    with pytest.raises(ValueError, match=r"loss='dpo' is not valid; choose one of \['nll', 'dft'\]"):
        SFTModule(toy(), loss="dpo")
