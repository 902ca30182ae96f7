"""LUSPO, and GSPO's choices for a token-level rollout_is correction, against hand-computed examples."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.core.losses.policy_losses import GSPO, LUSPO, PPOClip, policy_loss

LN2 = math.log(2.0)
SQRT2 = math.sqrt(2.0)


# ------------------------------------------------------------------ LUSPO


def test_luspo_gives_every_token_the_same_gradient_whatever_its_length():
    # on-policy (s = 1), A = +1, unclipped: each token's loss is -1. Rows of 1 and 3 tokens.
    # GSPO (seq-mean-token-mean): (-1 + -1) / 2 = -1, grads 1/(2*1) and 1/(2*3) -> row 1's tokens count 3x less;
    # LUSPO (seq-mean-token-sum): (-1 + -3) / 2 = -2, every token's grad -1/2
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, 1.0])
    grads = {}
    for loss, mode, value in ((GSPO(), "seq-mean-token-mean", -1.0), (LUSPO(), "seq-mean-token-sum", -2.0)):
        log_probs = torch.zeros(2, 3, requires_grad=True)
        scalar = aggregate_loss(loss(log_probs, None, adv, mask).loss, mask, mode)
        assert scalar.item() == pytest.approx(value)
        scalar.backward()
        grads[type(loss).__name__] = log_probs.grad
    assert_close(grads["GSPO"], torch.tensor([[-0.5, 0, 0], [-1 / 6, -1 / 6, -1 / 6]]))
    assert_close(grads["LUSPO"], torch.tensor([[-0.5, 0, 0], [-0.5, -0.5, -0.5]]))


def test_luspo_is_gspo_per_token_with_the_papers_clip_range():
    luspo = policy_loss("luspo")
    assert (luspo.clip_low, luspo.clip_high) == (2e-3, 2.5e-3)
    log_probs = torch.zeros(2, 2)
    old = torch.tensor([[-LN2, 0.0], [0.01, 0.0]])
    args = (log_probs, old, torch.tensor([1.0, -1.0]), None)
    assert_close(luspo(*args).loss, GSPO(clip_low=2e-3, clip_high=2.5e-3)(*args).loss)


def test_luspo_checks_the_aggregation():
    LUSPO().check("seq-mean-token-sum")
    with pytest.raises(ValueError, match="LUSPO weighs each sequence's loss by its length.*seq-mean-token-sum"):
        LUSPO().check("seq-mean-token-mean")


# ------------------------------------------------------------------ rollout_is


def test_a_loss_multiplies_each_tokens_loss_by_its_weight_by_default():
    log_probs = torch.zeros(1, 2)
    old = torch.tensor([[-LN2, 0.0]])  # ratios 2, 1; clipped at 1.2 for A = +1
    out = PPOClip().with_rollout_is(log_probs, old, torch.tensor([1.0]), None, torch.tensor([[0.5, 3.0]]))
    assert_close(out.loss, torch.tensor([[-0.6, -3.0]]))


# One row of 3 tokens with log-ratios [ln 4, ln 2, 0], A = +1, no clip in reach (clip 10);
# token_mask weights [0, .5, 1.5]: the first token is rejected.
#   after_ratio:  s = exp((ln 4 + ln 2 + 0) / 3) = 2, every token's loss -2 (value)
#     token:      loss -2 w_t = [0, -1, -3], grad -s w_t (each token its own weight)
#     row_mean:   mean w = 2/3 over the 3 tokens: loss and grad -4/3 on every token, the rejected one too (TRL)
#   before_ratio: the rejected token leaves first: s = exp((ln 2 + 0) / 2) = sqrt 2
#     token:      [0, -.5 sqrt 2, -1.5 sqrt 2]
#     row_mean:   mean w = 1 over the 2 kept tokens: [0, -sqrt 2, -sqrt 2] (AReaL)
CONVENTIONS = {
    ("token", "after_ratio"): [0.0, -1.0, -3.0],
    ("row_mean", "after_ratio"): [-4 / 3, -4 / 3, -4 / 3],
    ("token", "before_ratio"): [0.0, -0.5 * SQRT2, -1.5 * SQRT2],
    ("row_mean", "before_ratio"): [0.0, -SQRT2, -SQRT2],
}


@pytest.mark.parametrize("weight, rejection", sorted(CONVENTIONS))
def test_gspo_rollout_is_conventions_by_hand(weight, rejection):
    log_probs = torch.zeros(1, 3, requires_grad=True)
    old = -torch.tensor([[2 * LN2, LN2, 0.0]])
    loss = GSPO(clip_low=10.0, clip_high=10.0, rollout_is_weight=weight, rollout_is_rejection=rejection)
    out = loss.with_rollout_is(log_probs, old, torch.tensor([1.0]), None, torch.tensor([[0.0, 0.5, 1.5]]))
    expected = torch.tensor([CONVENTIONS[weight, rejection]])
    assert_close(out.loss, expected)
    out.loss.sum().backward()
    assert_close(log_probs.grad, expected)  # d(-s_it w)/d logp_t = -s w: the same numbers
    ratio = 2.0 if rejection == "after_ratio" else SQRT2
    assert out.stats["ratio_max"].item() == pytest.approx(ratio)  # before_ratio: statistics of the kept tokens


def test_gspo_row_mean_keeps_the_loss_value_and_moves_the_gradient():
    # two rows with a padded token; truncated weights (none rejected): the aggregated value is the same either way
    f64 = dict(dtype=torch.float64)
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]], **f64, requires_grad=True)
    old = log_probs.detach() + torch.tensor([[0.1, -0.2, 0.3], [0.05, 0.0, 9.0]], **f64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights = torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.7, 1.0]], **f64)
    adv = torch.tensor([1.0, -1.0], **f64)
    results = {}
    for weight in ("token", "row_mean"):
        log_probs.grad = None
        out = GSPO(clip_low=0.5, clip_high=0.5, rollout_is_weight=weight).with_rollout_is(
            log_probs, old, adv, mask, weights
        )
        scalar = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
        scalar.backward()
        results[weight] = (scalar.item(), log_probs.grad.clone())
    assert results["token"][0] == pytest.approx(results["row_mean"][0], rel=1e-12)
    # row_mean: within a row every real token's gradient is the same (the row's mean weight)
    row_mean_grad = results["row_mean"][1]
    assert_close(row_mean_grad[0], row_mean_grad[0, :1].expand(3))
    assert row_mean_grad[1, 2].item() == 0.0
    assert not torch.allclose(results["token"][1], row_mean_grad)


def test_gspo_with_a_sequence_weight_every_convention_agrees():
    log_probs = torch.zeros(2, 2)
    old = torch.tensor([[-0.1, 0.2], [0.0, 0.3]])
    weights = torch.tensor([[0.0], [1.3]])  # sequence_mask rejected row 0
    outs = [
        GSPO(rollout_is_weight=w, rollout_is_rejection=r).with_rollout_is(
            log_probs, old, torch.tensor([1.0, -1.0]), None, weights
        )
        for w, r in CONVENTIONS
    ]
    for out in outs[1:]:
        assert_close(out.loss, outs[0].loss)
    assert outs[0].loss[0].abs().sum() == 0.0


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda: GSPO(rollout_is_weight="mean"),
            r"GSPO: rollout_is_weight='mean' is not valid; choose one of \['token', 'row_mean'\]",
        ),
        (
            lambda: LUSPO(rollout_is_rejection="before"),
            r"LUSPO: rollout_is_rejection='before' is not valid; choose one of \['after_ratio', 'before_ratio'\]",
        ),
        (lambda: LUSPO(clip_low=-1.0), "LUSPO: clip_low must be >= 0"),
    ],
)
def test_options_are_checked_when_built(build, match):
    with pytest.raises(ValueError, match=match):
        build()
