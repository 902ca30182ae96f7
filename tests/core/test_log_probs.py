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


def test_log_probs_and_entropy_from_one_logsumexp_match_the_separate_functions():
    from rlvr_lightning.core.entropy import entropy_from_logits
    from rlvr_lightning.core.log_probs import token_log_probs_and_entropy

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    logits[0, 0, 2] = float("-inf")  # a probability-0 token contributes 0 to the entropy
    ids = torch.randint(0, 7, (3, 5))
    ids[0, 0] = 1
    for temperature in (1.0, 0.7):
        for grad in (True, False):
            log_probs, entropy = token_log_probs_and_entropy(logits, ids, temperature, entropy_grad=grad)
            torch.testing.assert_close(log_probs, token_log_probs_from_logits(logits, ids, temperature))
            torch.testing.assert_close(entropy, entropy_from_logits(logits, temperature))
    # two equally likely tokens and one impossible: H = log 2, by hand
    _, entropy = token_log_probs_and_entropy(torch.tensor([[[0.0, 0.0, float("-inf")]]]), torch.tensor([[0]]))
    torch.testing.assert_close(entropy, torch.tensor([[math.log(2.0)]]))


def test_detached_entropy_carries_no_graph_and_the_attached_one_does():
    from rlvr_lightning.core.log_probs import token_log_probs_and_entropy

    logits = torch.randn(2, 3, 4, requires_grad=True)
    ids = torch.zeros(2, 3, dtype=torch.long)
    log_probs, entropy = token_log_probs_and_entropy(logits, ids, entropy_grad=False)
    assert log_probs.requires_grad and not entropy.requires_grad
    _, entropy = token_log_probs_and_entropy(logits, ids, entropy_grad=True)
    entropy.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
