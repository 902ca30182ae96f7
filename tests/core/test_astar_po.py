"""A*-PO (Brantley et al. 2025): the optimal value and the regression loss by hand and against TRL's A2POTrainer."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.advantages.optimal_value import optimal_values, prompt_key
from rlvr_lightning.core import AStarPO, aggregate_loss


def trl_v_star(rewards, beta1):
    """TRL `A2POTrainer._estimate_optimal_values`'s V* (trl/experimental/a2po/a2po_trainer.py, f2cd577), restated."""
    n = rewards.shape[1]
    return beta1 * (torch.logsumexp(rewards / beta1, dim=1) - math.log(n))


def trl_loss(policy_logps, ref_logps, rewards, v_star, beta2):
    """TRL `A2POTrainer.compute_loss` on sequence log-probs (f2cd577), restated."""
    implicit_reward = beta2 * (policy_logps - ref_logps)
    target = rewards - v_star
    return ((implicit_reward - target) ** 2).mean()


def test_optimal_value_by_hand():
    rewards = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    # 0.5 ln((1 + e^2) / 2); a prompt the reference always solves: 1; never: 0
    assert optimal_values(rewards, 0.5).tolist() == pytest.approx([0.5 * math.log((1 + math.e**2) / 2), 1.0, 0.0])
    # a soft maximum: the mean as beta1 grows, the maximum as it shrinks
    assert optimal_values(rewards[:1], 1e4).item() == pytest.approx(0.5, abs=1e-4)
    assert optimal_values(rewards[:1], 1e-3).item() == pytest.approx(1.0 - 1e-3 * math.log(2))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optimal_value_equals_trls(seed):
    torch.manual_seed(seed)
    rewards = torch.randint(0, 2, (16, 8)).double()
    for beta1 in (0.1, 0.5, 2.0):
        assert_close(optimal_values(rewards, beta1), trl_v_star(rewards, beta1))


def test_loss_by_hand():
    log_probs = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.5]]))
    mask = torch.tensor([[1, 1], [1, 0]])
    advantages = torch.tensor([0.2, -0.5])
    out = AStarPO(beta2=0.1)(log_probs, None, advantages, mask, ref_log_probs=ref)
    # row 0: log ratio ln 2, implicit reward 0.1 ln 2; row 1 (its padding never counts): -0.1 ln 2
    first, second = (0.1 * math.log(2) - 0.2) ** 2, (-0.1 * math.log(2) + 0.5) ** 2
    assert_close(out.loss, torch.tensor([[first, first], [second, 0.0]]))
    assert_close(aggregate_loss(out.loss, mask, "seq-mean-token-mean"), torch.tensor((first + second) / 2))
    aggregate_loss(out.loss, mask, "seq-mean-token-mean").backward()
    # d/dlogp_t of (1/2) sum_i (beta2 s_i - A_i)^2 = beta2 (beta2 s_i - A_i) on each real token of row i
    grad_first, grad_second = 0.1 * (0.1 * math.log(2) - 0.2), 0.1 * (-0.1 * math.log(2) + 0.5)
    assert_close(log_probs.grad, torch.tensor([[grad_first, grad_first], [grad_second, 0.0]]))
    assert out.extra_stats["implicit_reward"].item() == pytest.approx(0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_equals_trls(seed):
    torch.manual_seed(seed)
    log_probs = -torch.rand(6, 9, dtype=torch.float64) * 3
    ref = -torch.rand(6, 9, dtype=torch.float64) * 3
    mask = torch.ones(6, 9, dtype=torch.bool)
    for row, length in enumerate([9, 3, 7, 1, 5, 8]):
        mask[row, length:] = False
    rewards = torch.randint(0, 2, (6,)).double()
    v_star = torch.rand(6, dtype=torch.float64)
    theirs_in = log_probs.clone().requires_grad_()
    theirs = trl_loss((theirs_in * mask).sum(1), (ref * mask).sum(1), rewards, v_star, 1e-2)
    ours_in = log_probs.clone().requires_grad_()
    out = AStarPO(beta2=1e-2)(ours_in, None, rewards - v_star, mask, ref_log_probs=ref)
    ours = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
    assert_close(ours, theirs)
    theirs.backward(), ours.backward()
    assert_close(ours_in.grad, theirs_in.grad)


def test_refusals():
    with pytest.raises(ValueError, match="beta2 must be > 0"):
        AStarPO(beta2=0.0)
    with pytest.raises(ValueError, match="aggregation.mode='token-mean' would weigh responses by their length"):
        AStarPO().check("token-mean")
    with pytest.raises(ValueError, match="needs the reference's log-probs"):
        AStarPO()(torch.zeros(1, 2), None, torch.zeros(1), None)
    with pytest.raises(ValueError, match="one advantage per response"):
        AStarPO()(torch.zeros(1, 2), None, torch.zeros(1, 2), None, ref_log_probs=torch.zeros(1, 2))


def test_prompt_keys():
    assert prompt_key("2 + 2") == "2 + 2"
    assert prompt_key(torch.tensor([3, 1])) == prompt_key([3, 1]) == (3, 1)
    chat = [{"role": "user", "content": "hi"}]
    assert prompt_key(chat) == prompt_key([{"content": "hi", "role": "user"}])
    assert hash(prompt_key(chat)) is not None
