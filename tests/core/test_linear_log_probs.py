"""`linear_token_log_probs`: the output layer and the chosen tokens' log-probs in one function whose backward
runs over row chunks: the values, entropies and gradients of the logits path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rlvr_lightning.core import log_probs as lp
from rlvr_lightning.core.log_probs import (
    backward_chunk_rows,
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
    monkeypatch.setattr(lp, "CPU_BACKWARD_CHUNK_BYTES", 4 * 11 * 4)  # chunks of 4 float32 rows: 15 rows in 4 chunks
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


class _Ops(TorchDispatchMode):
    """The operators run inside the block, with their tensor arguments' dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[torch.dtype]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        self.calls.append((func.__name__.split(".")[0], dtypes))
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> int:
        return sum(op == name for op, _ in self.calls)


def test_chunk_rows_follow_the_byte_budget():
    # float32 gradient rows of V * 4 bytes; under bf16 GEMMs each row also has its V * 2-byte copy
    assert backward_chunk_rows(11, torch.float32, 4 * 11 * 4) == 4
    assert backward_chunk_rows(11, torch.float32, 4 * 11 * 4 - 1) == 3
    assert backward_chunk_rows(11, torch.bfloat16, 4 * 11 * 6) == 4
    assert backward_chunk_rows(49152, torch.float32, 1 << 30) == 5461
    assert backward_chunk_rows(11, torch.float32, 1) == 1  # at least one row


@pytest.mark.parametrize(("rows", "chunks"), [(1, 15), (4, 4), (15, 1), (100, 1)])
def test_byte_budget_chunks_equal_the_unchunked_backward(rows, chunks):
    hidden, weight, b, ids = _inputs(bias=True)
    weights = torch.randn(3, 5)
    whole, _ = linear_token_log_probs(hidden, weight, b, ids, 0.7, chunk_bytes=1 << 40)
    (whole * weights).sum().backward()
    expected = [t.grad.clone() for t in (hidden, weight, b)]
    for t in (hidden, weight, b):
        t.grad = None
    got, _ = linear_token_log_probs(hidden, weight, b, ids, 0.7, chunk_bytes=rows * 11 * 4)
    assert torch.equal(got, whole)
    ops = _Ops()
    with ops:
        (got * weights).sum().backward()
    assert ops.count("scatter_add_") == chunks  # one logit-gradient chunk each
    for t, want in zip((hidden, weight, b), expected, strict=True):
        torch.testing.assert_close(t.grad, want, atol=1e-6, rtol=0)


def test_under_autocast_the_backward_gemms_run_in_its_dtype():
    """As autograd's would under autocast: bf16 GEMMs, float32 gradients for float32 parameters; close to autograd
    through the bf16 linear layer."""
    hidden, weight, b, ids = _inputs(bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = token_log_probs_from_logits(F.linear(hidden, weight), ids, 0.7)
    expected.sum().backward()
    expected_grads = [hidden.grad.clone(), weight.grad.clone()]
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = linear_token_log_probs(hidden, weight, None, ids, 0.7, chunk_bytes=4 * 11 * 6)
    torch.testing.assert_close(got, expected)
    ops = _Ops()
    with ops:
        got.sum().backward()
    gemms = [dtypes for op, dtypes in ops.calls if op in ("mm", "addmm")]
    assert len(gemms) == 8 and all(dtypes == [torch.bfloat16] * 2 for dtypes in gemms)  # 4 chunks x 2 GEMMs
    assert hidden.grad.dtype == weight.grad.dtype == torch.float32
    for tensor, want in zip((hidden, weight), expected_grads, strict=True):
        torch.testing.assert_close(tensor.grad, want, atol=2e-2, rtol=2e-2)


def test_the_cpu_default_keeps_chunks_of_2_to_the_22_float32_logits():
    """The CPU's chunks (and so its sums, to the bit) are the ones the CPU trajectories were recorded with."""
    for vocab in (10, 49152, 151936):
        rows = lp.backward_chunk_rows(vocab, torch.float32, lp.CPU_BACKWARD_CHUNK_BYTES)
        assert rows == max(1, (1 << 22) // vocab)
