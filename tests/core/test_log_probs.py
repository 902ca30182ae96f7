import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.log_probs import token_log_probs_from_logits

# softmax([0, ln 3]) = [1/4, 3/4]
LOGITS = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])  # [1, 2, 2]
TOKENS = torch.tensor([[1, 0]])


def test_gathers_log_softmax_at_tokens():
    out = token_log_probs_from_logits(LOGITS, TOKENS)
    assert out.shape == (1, 2)
    assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]]))


def test_temperature_divides_logits():
    # logits / 2 = [0, ln sqrt 3] -> p(token 1) = sqrt3 / (1 + sqrt3)
    p1 = math.sqrt(3.0) / (1.0 + math.sqrt(3.0))
    out = token_log_probs_from_logits(LOGITS, TOKENS, temperature=2.0)
    assert_close(out, torch.tensor([[math.log(p1), math.log(1.0 - p1)]]))


def test_large_logits_do_not_overflow():
    # a naive log(exp(l) / sum exp(l)) gives nan at l ~ 1000; tolerance = float32 spacing at 1000
    out = token_log_probs_from_logits(LOGITS + 1000.0, TOKENS)
    assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]]), atol=1e-4, rtol=0)


def test_bf16_upcast_to_float32():
    out = token_log_probs_from_logits(LOGITS.to(torch.bfloat16), TOKENS)
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([[math.log(0.75), math.log(0.25)]]), atol=1e-2, rtol=1e-2)


def test_gradient_is_onehot_minus_softmax():
    logits = LOGITS[:, :1].clone().requires_grad_(True)  # one position, probs [1/4, 3/4]
    token_log_probs_from_logits(logits, TOKENS[:, :1]).sum().backward()
    assert_close(logits.grad, torch.tensor([[[-0.25, 0.25]]]))


def test_rejects_non_positive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs_from_logits(LOGITS, TOKENS, temperature=0.0)
