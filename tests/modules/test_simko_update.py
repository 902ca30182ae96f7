"""SimKO in the update: the loss gets the policy's current top-K candidates at each position (differentiable, from
the training forward), the tokens' entropies and which responses are correct; the options it cannot share a forward
with, and a reward that cannot tell correctness, are refused."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.advantages import CenteredAdvantage
from rlvr_lightning.core import SimKO
from rlvr_lightning.modules import PPOModule, RLVRModule
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.modules.ppo_options import ValueConfig
from tests.modules.test_positive_nll import Constant, FirstTokenEven, fit, policy


class RecordedSimKO(SimKO):
    """SimKO that keeps what the update hands it."""

    def __init__(self):
        super().__init__(top_k=2, mix_coef=0.5)
        self.handed = []

    def __call__(self, log_probs, old_log_probs, advantages, mask, **inputs):
        self.handed.append((log_probs.detach(), mask, dict(inputs)))
        return super().__call__(log_probs, old_log_probs, advantages, mask, **inputs)


def test_the_loss_reads_the_policys_top_k_entropies_and_correctness(in_tmp_dir):
    loss = RecordedSimKO()
    module = RLVRModule(policy(), group_size=4, loss=loss, update=UpdateConfig(epochs=2, mini_batch_size=16))
    _, recorder = fit(module, [FirstTokenEven(), CenteredAdvantage()], steps=2, batch_size=8)
    for log_probs, mask, inputs in loss.handed:
        top, sampled = inputs["top_log_probs"], inputs["top_is_sampled"]
        assert top.shape == (*log_probs.shape, 2) and top.requires_grad  # from the training forward
        real = mask if mask is not None else torch.ones_like(log_probs, dtype=torch.bool)
        assert bool((top[..., 0] >= top[..., 1]).all())  # the candidates, likeliest first
        assert bool((top[..., 0].detach() >= log_probs - 1e-6)[real].all())
        # where the sampled token is the top-1 candidate, its log-prob is the candidate's
        torch.testing.assert_close(log_probs[sampled[..., 0]], top.detach()[..., 0][sampled[..., 0]])
        assert inputs["correct"].dtype == torch.bool and inputs["correct"].shape == log_probs.shape[:1]
        assert inputs["entropy"].shape == log_probs.shape and not inputs["entropy"].requires_grad
    correct = module.last_rollout.correct
    assert torch.equal(correct, module.last_rollout.response_ids[:, 0] % 2 == 0)  # FirstTokenEven's is_correct
    assert any(step["train/simko_boosted"] > 0 for step in recorder.steps)


def test_a_reward_that_cannot_tell_correctness_is_refused(in_tmp_dir):
    module = RLVRModule(policy(), group_size=2, loss="simko")
    with pytest.raises(ValueError, match="SimKO trains on which responses are correct"):
        fit(module, [Constant(), CenteredAdvantage()], steps=1)


def test_a_shared_critic_cannot_read_the_top_k():
    with pytest.raises(ValueError, match="a loss reading the policy's top-K, SimKO.*value.model=separate"):
        PPOModule(policy(), group_size=2, loss="simko", value=ValueConfig(model="shared"))
    PPOModule(policy(), group_size=2, loss="simko", value=ValueConfig(model="separate"))  # its own forward
