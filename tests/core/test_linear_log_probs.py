"""`linear_token_log_probs`: the output layer and the chosen tokens' log-probs in one function whose backward
runs over row chunks: the values, entropies and gradients of the logits path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlvr_lightning.core import log_probs as lp
from rlvr_lightning.core.log_probs import (
    linear_token_log_probs,
    token_log_probs_and_entropy,
    token_log_probs_from_logits,
)


def _inputs(bias: bool, dtype=torch.float32):
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 8, dtype=dtype, requires_grad=True)
    weight = torch.randn(11, 8, dtype=dtype, requires_grad=True)
    b = torch.randn(11, dtype=dtype, requires_grad=True) if bias else None
    return hidden, weight, b, torch.randint(0, 11, (3, 5))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_values_entropy_and_gradients_equal_the_logits_path(temperature, bias, monkeypatch):
    monkeypatch.setattr(lp, "_BACKWARD_CHUNK_ELEMENTS", 4 * 11)  # chunks of 4 rows: 15 rows in 4 chunks
    hidden, weight, b, ids = _inputs(bias)
    weights = torch.randn(3, 5)
    expected, expected_entropy = token_log_probs_and_entropy(
        F.linear(hidden, weight, b), ids, temperature, entropy_grad=False
    )
    (expected * weights).sum().backward()
    expected_grads = [t.grad.clone() for t in (hidden, weight, b) if t is not None]
    for t in (hidden, weight, b):
        if t is not None:
            t.grad = None
    got, entropy = linear_token_log_probs(hidden, weight, b, ids, temperature, with_entropy=True)
    assert torch.equal(got, expected)  # the same operations forward
    assert torch.equal(entropy, expected_entropy)
    (got * weights).sum().backward()
    for tensor, want in zip([t for t in (hidden, weight, b) if t is not None], expected_grads, strict=True):
        torch.testing.assert_close(tensor.grad, want, atol=1e-6, rtol=1e-5)


def test_gradients_against_finite_differences():
    torch.manual_seed(0)
    hidden = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(7, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (4,))
    function = lambda h, w, b: linear_token_log_probs(h, w, b, ids, 0.8)[0]  # noqa: E731
    assert torch.autograd.gradcheck(function, (hidden, weight, bias))


def test_a_hand_computed_example():
    # one position, logits (0, log 3) over 2 tokens: p = (1/4, 3/4); d log p_1 / d logits = (-1/4, 1/4)
    hidden = torch.tensor([[1.0]], requires_grad=True)
    weight = torch.tensor([[0.0], [torch.log(torch.tensor(3.0))]], requires_grad=True)
    log_prob, _ = linear_token_log_probs(hidden, weight, None, torch.tensor([1]))
    torch.testing.assert_close(log_prob, torch.log(torch.tensor([0.75])))
    log_prob.sum().backward()
    # d/dW_v = (onehot - p)_v * h; d/dh = sum_v (onehot - p)_v W_v = 1/4 * log 3
    torch.testing.assert_close(weight.grad, torch.tensor([[-0.25], [0.25]]))
    torch.testing.assert_close(hidden.grad, torch.tensor([[0.25 * torch.log(torch.tensor(3.0)).item()]]))
    assert token_log_probs_from_logits(F.linear(hidden, weight), torch.tensor([1])).item() == log_prob.item()
