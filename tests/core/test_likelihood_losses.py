"""The likelihood losses of supervised fine-tuning: NLL and DFT, by hand, against TRL's DFT, and in SFTModule."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.likelihood import likelihood_token_loss


def trl_dft_loss(logits, labels, num_items_in_batch=None):
    """TRL's `dft_loss` (trl/trainer/sft_trainer.py, f2cd577), restated with torch only."""
    labels = torch.nn.functional.pad(labels, (0, 1), value=-100)
    shift_labels = labels[..., 1:].clone()
    loss_mask = shift_labels != -100
    shift_labels[~loss_mask] = 0
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, shift_labels.unsqueeze(-1)).squeeze(-1)
    per_token_loss = -logprobs.exp().detach() * logprobs
    if num_items_in_batch is None:
        num_items_in_batch = loss_mask.sum()
    return (per_token_loss * loss_mask).sum() / num_items_in_batch


def test_dft_by_hand():
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 1.0]])).requires_grad_()
    loss = likelihood_token_loss(log_probs, "dft")
    # -p log p: 0.5 ln 2, 0.25 ln 4 (= 0.5 ln 2), 0
    assert_close(loss.detach(), torch.tensor([[0.5 * math.log(2), 0.5 * math.log(2), 0.0]]))
    loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[-0.5, -0.25, -1.0]]))  # d/dlogp of -sg(p) logp = -p
    assert_close(likelihood_token_loss(log_probs, "nll"), -log_probs)


def test_dft_gradient_is_that_of_minus_the_probability():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, requires_grad=True)
    targets = torch.randint(0, 7, (3, 5))
    log_probs = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (dft,) = torch.autograd.grad(likelihood_token_loss(log_probs, "dft").mean(), logits, retain_graph=True)
    (minus_p,) = torch.autograd.grad(-log_probs.exp().mean(), logits)
    assert_close(dft, minus_p)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_mean_dft_equals_trls(seed):
    torch.manual_seed(seed)
    logits = torch.randn(4, 9, 11)
    labels = torch.randint(0, 11, (4, 9))
    labels[:, :3] = -100  # the prompt
    labels[1, 7:] = -100  # a shorter response
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    mask = shifted != -100
    log_probs = torch.log_softmax(logits, -1).gather(-1, shifted.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    ours = aggregate_loss(likelihood_token_loss(log_probs, "dft"), mask.float(), "token-mean")
    assert_close(ours, trl_dft_loss(logits, labels))


def test_an_unknown_loss_is_named():
    with pytest.raises(ValueError, match=r"loss='kl' is not a likelihood loss; choose one of \['nll', 'dft'\]"):
        likelihood_token_loss(torch.zeros(1, 1), "kl")
