import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.policy_losses import (
    CISPO,
    GSPO,
    POLICY_LOSSES,
    ImportanceRatio,
    PolicyGradient,
    PPOClip,
    merged_stats,
    policy_loss,
)
from rlvr_lightning.core.losses.token_selection import pick_tokens

LN2 = math.log(2.0)


def _at_ratios(ratios):
    """log_probs = 0 (leaf, requires grad) and old_log_probs chosen so exp(logp - old) == ratios."""
    ratios = torch.tensor(ratios)
    log_probs = torch.zeros_like(ratios, requires_grad=True)
    return log_probs, -torch.log(ratios)


def _stat(out, key):
    return out.stats[key].item()


# ------------------------------------------------------------------ naive pg


def test_naive_pg_value_grad_and_stats():
    log_probs = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    out = PolicyGradient()(log_probs, None, torch.tensor([2.0]), torch.tensor([[1, 0]]))
    # -A log p = -2 ln .5 = 2 ln 2; second token masked -> 0
    assert_close(out.loss, torch.tensor([[2 * LN2, 0.0]]))
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[-2.0, 0.0]]))
    assert [_stat(out, k) for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max")] == [
        0.0,
        0.0,
        1.0,
        1.0,
        1.0,
    ]


def test_token_level_advantages_are_accepted():
    log_probs = torch.tensor([[math.log(0.5), math.log(0.5)]])
    out = PolicyGradient()(log_probs, None, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert_close(out.loss, torch.tensor([[LN2, -LN2]]))


# ------------------------------------------------------------------ importance ratio


def test_ratio_is_exp_of_log_prob_difference():
    # p = .5, p_old = .25 -> ratio 2 (a buggy logp / old_logp would give ln.5 / ln.25 = 0.5)
    log_probs = torch.tensor([[math.log(0.5)]])
    old = torch.tensor([[math.log(0.25)]])
    out = ImportanceRatio()(log_probs, old, torch.tensor([1.0]), torch.ones(1, 1))
    assert_close(out.loss, torch.tensor([[-2.0]]))
    assert _stat(out, "ratio_mean") == pytest.approx(2.0)
    assert _stat(out, "clip_frac_high") == 0.0


# ------------------------------------------------------------------ PPO clip


def test_ppo_clip_symmetric():
    # row 0 A=+1: r=1.5 -> clipped at 1.2 -> -1.2 ; r=1.1 -> -1.1
    # row 1 A=-1: r=0.5 -> -min(-.5, -.8) = .8 (clipped) ; r=1.5 -> -min(-1.5, -1.2) = 1.5 (not clipped)
    log_probs, old = _at_ratios([[1.5, 1.1], [0.5, 1.5]])
    out = PPOClip(clip_low=0.2, clip_high=0.2)(log_probs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    assert_close(out.loss, torch.tensor([[-1.2, -1.1], [0.8, 1.5]]))
    assert _stat(out, "clip_frac_low") == pytest.approx(0.25)
    assert _stat(out, "clip_frac_high") == pytest.approx(0.25)
    assert _stat(out, "ratio_mean") == pytest.approx(1.15)
    assert _stat(out, "ratio_min") == pytest.approx(0.5)
    assert _stat(out, "ratio_max") == pytest.approx(1.5)
    assert "dual_clip_frac" not in out.stats
    # clipped tokens get no gradient; unclipped get d(-A r)/dlogp = -A r
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[0.0, -1.1], [0.0, 1.5]]))


def test_ppo_clip_higher_is_asymmetric():
    # clip_high .28: r=1.5, A=+1 -> -1.28 ; r=1.25, A=+1 -> -1.25 (symmetric .2 would give -1.2)
    # clip_low .2: r=0.7, A=-1 -> -min(-.7, -.8) = .8
    log_probs, old = _at_ratios([[1.5], [1.25], [0.7]])
    out = PPOClip(clip_low=0.2, clip_high=0.28)(log_probs, old, torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, 1))
    assert_close(out.loss, torch.tensor([[-1.28], [-1.25], [0.8]]))
    assert _stat(out, "clip_frac_high") == pytest.approx(1 / 3)
    assert _stat(out, "clip_frac_low") == pytest.approx(1 / 3)


def test_ppo_dual_clip():
    # A=-1, r=5, c=3: ppo loss max(5, 1.2) = 5 -> min(5, 3) = 3
    # A=-1, r=2: min(2, 3) = 2 ; A=+1, r=5: dual clip not applied -> -1.2
    log_probs, old = _at_ratios([[5.0], [2.0], [5.0]])
    out = PPOClip(dual_clip=3.0)(log_probs, old, torch.tensor([-1.0, -1.0, 1.0]), torch.ones(3, 1))
    assert_close(out.loss, torch.tensor([[3.0], [2.0], [-1.2]]))
    assert _stat(out, "dual_clip_frac") == pytest.approx(1 / 3)
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[0.0], [2.0], [0.0]]))


def test_ppo_dual_clip_must_exceed_one():
    log_probs, old = _at_ratios([[1.0]])
    with pytest.raises(ValueError, match="dual_clip"):
        PPOClip(dual_clip=1.0)(log_probs, old, torch.tensor([1.0]), torch.ones(1, 1))


def test_masked_tokens_are_exactly_zero_even_with_garbage():
    log_probs = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1e4]])  # ratio e^1e4 would overflow without clamp + mask
    out = PPOClip()(log_probs, old, torch.tensor([-1.0]), torch.tensor([[1, 0]]))
    assert out.loss[0, 1].item() == 0.0
    out.loss.sum().backward()
    assert torch.isfinite(log_probs.grad).all()
    assert _stat(out, "ratio_max") == 1.0  # masked token ignored


def call_loss(kind, log_probs, old, advantages, mask):
    """The loss `kind` on these inputs, with what the update hands it besides (made on `log_probs`' device)."""
    loss, device = policy_loss(kind), log_probs.device
    if loss.selection_reads_entropy:  # the update hands it its pick by entropy
        entropy = torch.linspace(0.1, 1.0, log_probs.numel(), device=device).view_as(log_probs)
        selected = pick_tokens(loss, log_probs, old, advantages, mask, entropy)
        return loss(log_probs, old, advantages, mask, selected=selected)
    inputs = {}
    if loss.reads_entropy:  # the update hands it the tokens' entropies
        inputs["entropy"] = torch.linspace(0.1, 1.0, log_probs.numel(), device=device).view_as(log_probs)
    if loss.reads_reference:  # the update hands it the reference's log-probs
        inputs["ref_log_probs"] = old - 0.3
    if loss.reads_top_k:  # the update hands it the policy's top-K candidates: here the sampled token first
        ranks = torch.arange(loss.reads_top_k, device=device)
        inputs["top_log_probs"] = log_probs.unsqueeze(-1) - ranks.to(log_probs.dtype)
        inputs["top_is_sampled"] = ranks.expand(*log_probs.shape, -1) == 0
    if loss.reads_correctness:  # and which responses are correct: here every one
        inputs["correct"] = torch.ones(log_probs.shape[0], dtype=torch.bool, device=device)
    if loss.reads_groups:  # the update hands it each row's group: here every row in one group
        rows = log_probs.shape[0]
        inputs.update(group_index=torch.zeros(rows, dtype=torch.long, device=device), group_size=rows)
    return loss(log_probs, old, advantages, mask, **inputs)


@pytest.mark.parametrize("kind", sorted(POLICY_LOSSES))
def test_a_bool_mask_masks_like_an_int_mask(kind):
    # the update passes a bool mask: a padded token must count neither in the loss, nor in GSPO's sequence ratio,
    # nor in the statistics
    log_probs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = log_probs.detach() + torch.tensor([[0.1, -0.2, 5.0]])
    adv = torch.tensor([1.0])
    as_int = call_loss(kind, log_probs, old, adv, torch.tensor([[1, 1, 0]]))
    as_bool = call_loss(kind, log_probs, old, adv, torch.tensor([[True, True, False]]))
    assert as_bool.loss[0, 2].item() == 0.0
    assert_close(as_bool.loss, as_int.loss)
    for key, value in as_int.stats.items():
        assert_close(as_bool.stats[key], value, msg=key)


def test_empty_mask_stats():
    log_probs, old = _at_ratios([[2.0]])
    out = PPOClip()(log_probs, old, torch.tensor([1.0]), torch.zeros(1, 1))
    assert out.loss.item() == 0.0
    assert [_stat(out, k) for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_min", "ratio_max")] == [
        0.0,
        0.0,
        1.0,
        1.0,
        1.0,
    ]


# ------------------------------------------------------------------ old_log_probs=None


@pytest.mark.parametrize("kind", ["ratio", "ppo_clip", "gspo", "cispo", "sapo", "luspo", "vespo", "gmpo", "dppo"])
def test_old_none_gives_the_pg_gradient(kind):
    # ratio = exp(logp - sg(logp)) = 1 but d ratio / d logp = 1 -> grad of -A r is -A, like -A logp
    log_probs = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.1), math.log(0.9)]], requires_grad=True)
    advantages = torch.tensor([3.0, -2.0])
    mask = torch.ones(2, 2)
    out = policy_loss(kind)(log_probs, None, advantages, mask)
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[-3.0, -3.0], [2.0, 2.0]]))
    assert _stat(out, "ratio_min") == 1.0 and _stat(out, "ratio_max") == 1.0


# ------------------------------------------------------------------ GSPO


def test_gspo_sequence_ratio_and_clip():
    # row 0: log-ratios [ln 2, 0] (third token masked, log-ratio 5 ignored) -> s = exp(ln2 / 2) = sqrt 2
    #        A=+1 -> -min(1.414, 1.2) = -1.2 on both tokens, clipped -> no gradient
    # row 1: log-ratios [ln .5, ln .5] -> s = .5 ; A=+1 -> -min(.5, .8) = -.5, grad -A s = -.5 per token
    log_probs = torch.zeros(2, 3, requires_grad=True)
    old = torch.tensor([[-LN2, 0.0, -5.0], [LN2, LN2, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    out = GSPO(clip_low=0.2, clip_high=0.2)(log_probs, old, torch.tensor([1.0, 1.0]), mask)
    assert_close(out.loss, torch.tensor([[-1.2, -1.2, 0.0], [-0.5, -0.5, 0.0]]))
    assert _stat(out, "ratio_max") == pytest.approx(math.sqrt(2.0))
    assert _stat(out, "ratio_min") == pytest.approx(0.5)
    assert _stat(out, "clip_frac_high") == pytest.approx(0.5)  # 2 of 4 masked tokens
    out.loss.sum().backward()
    assert_close(log_probs.grad, torch.tensor([[0.0, 0.0, 0.0], [-0.5, -0.5, 0.0]]))


def test_gspo_differs_from_token_level_ppo():
    # token ratios [2, 1]: PPO clips only token 0; GSPO uses s = sqrt 2 for both and clips both
    log_probs = torch.zeros(1, 2)
    old = torch.tensor([[-LN2, 0.0]])
    args = (log_probs, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert_close(PPOClip()(*args).loss, torch.tensor([[-1.2, -1.0]]))
    assert_close(GSPO(clip_low=0.2, clip_high=0.2)(*args).loss, torch.tensor([[-1.2, -1.2]]))


# ------------------------------------------------------------------ CISPO


def test_cispo_clipped_weight_value_and_detached_gradient():
    # token 0: r = 1.5 -> weight 1.2 ; -1.2 * 1 * ln .5 = 1.2 ln 2
    # token 1: r = 0.5, no lower bound -> weight .5 ; -.5 * ln .5 = .5 ln 2
    log_probs = torch.tensor([[math.log(0.5), math.log(0.5)]], requires_grad=True)
    old = torch.tensor([[math.log(0.5 / 1.5), 0.0]])
    out = CISPO(clip_high=0.2)(log_probs, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert_close(out.loss, torch.tensor([[1.2 * LN2, 0.5 * LN2]]))
    out.loss.sum().backward()
    # weight is a constant: grad = -w A (an undetached weight would give -(r ln p + r) = -0.153 on token 1)
    assert_close(log_probs.grad, torch.tensor([[-1.2, -0.5]]))
    assert _stat(out, "clip_frac_high") == pytest.approx(0.5)
    assert _stat(out, "clip_frac_low") == 0.0


def test_cispo_lower_bound_and_negative_advantage():
    # clip_low .2: r = .5 -> weight .8 ; A = +1 -> -.8 ln .5 = .8 ln 2
    # r = 1.5, A = -1 -> weight 1.2 (clipped whatever the sign of A) ; -1.2 * -1 * ln .5 = -1.2 ln 2
    log_probs = torch.full((2, 1), math.log(0.5))
    old = torch.tensor([[0.0], [math.log(0.5 / 1.5)]])
    out = CISPO(clip_low=0.2, clip_high=0.2)(log_probs, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    assert_close(out.loss, torch.tensor([[0.8 * LN2], [-1.2 * LN2]]))
    assert _stat(out, "clip_frac_low") == pytest.approx(0.5)
    assert _stat(out, "clip_frac_high") == pytest.approx(0.5)


# ------------------------------------------------------------------ registry


def test_registry_names():
    assert list(POLICY_LOSSES) == [
        "pg", "ratio", "ppo_clip", "gspo", "cispo", "sapo", "luspo", "vespo", "gmpo", "dppo", "clip_cov",
        "kl_cov", "high_entropy", "topr", "gppo", "entropy_shaped", "astar_po", "luffy", "m2po", "dynamic_clip", "bapo",
        "gvpo", "archer", "aspo", "flowrl", "simko",
    ]  # fmt: skip


def test_shorthands_are_the_built_ins_with_their_defaults():
    assert isinstance(policy_loss("pg"), PolicyGradient) and not policy_loss("pg").needs_old_log_probs
    ppo = policy_loss("ppo_clip")
    assert (ppo.clip_low, ppo.clip_high, ppo.dual_clip) == (0.2, 0.2, None)
    assert (policy_loss("gspo").clip_low, policy_loss("gspo").clip_high) == (3e-4, 4e-4)
    assert (policy_loss("cispo").clip_low, policy_loss("cispo").clip_high) == (None, 0.2)
    custom = PPOClip(clip_low=0.1)
    assert policy_loss(custom) is custom and custom.clip_high == 0.1  # clip_high defaults to clip_low
    log_probs, old = _at_ratios([[1.5]])
    assert_close(
        PPOClip(clip_low=0.2, clip_high=0.3)(log_probs, old, torch.tensor([1.0]), torch.ones(1, 1)).loss,
        torch.tensor([[-1.3]]),
    )


def test_unknown_shorthand_names_option_value_and_choices():
    with pytest.raises(ValueError) as err:
        policy_loss("grpo")
    assert "loss='grpo'" in str(err.value) and all(name in str(err.value) for name in POLICY_LOSSES)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: PPOClip(clip_low=-0.1), "PPOClip: clip_low must be >= 0"),
        (lambda: PPOClip(clip_high=-0.1), "PPOClip: clip_high must be >= 0"),
        (lambda: PPOClip(dual_clip=0.5), "dual_clip must be > 1"),
        (lambda: GSPO(clip_high=-1.0), "GSPO: clip_high must be >= 0"),
        (lambda: CISPO(clip_low=-1.0), "CISPO: clip_low must be >= 0"),
    ],
)
def test_hyper_parameters_are_checked_when_built(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_gspo_checks_the_aggregation():
    GSPO().check("seq-mean-token-mean")
    GSPO().check("token-mean")  # AReaL's aggregation, which the AReaL comparison uses
    for mode in ("seq-mean-token-sum", "seq-sum-constant"):
        with pytest.raises(ValueError, match=f"aggregation.mode='{mode}'.*seq-mean-token-mean"):
            GSPO().check(mode)
    for loss in (PolicyGradient(), ImportanceRatio(), PPOClip(), CISPO()):
        loss.check("token-mean")


def test_shape_validation():
    with pytest.raises(ValueError, match="advantages"):
        PolicyGradient()(torch.zeros(2, 3), None, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        PolicyGradient()(torch.zeros(2, 3), None, torch.zeros(2), torch.ones(2, 2))


# ------------------------------------------------------------------ mask=None and merged statistics


@pytest.mark.parametrize("kind", sorted(POLICY_LOSSES))
def test_no_mask_equals_an_all_ones_mask(kind):
    torch.manual_seed(0)
    log_probs = torch.randn(3, 4).clamp(max=-0.1)
    old = log_probs + 0.3 * torch.randn(3, 4)
    advantages = torch.tensor([1.0, -0.5, 2.0])
    with_mask = call_loss(kind, log_probs, old, advantages, torch.ones(3, 4))
    without = call_loss(kind, log_probs, old, advantages, None)
    assert_close(without.loss, with_mask.loss)
    for key, value in with_mask.stats.items():
        assert_close(without.stats[key], value, msg=key)


def test_merged_stats_weigh_every_token_alike():
    # micro-batch 1: ratios 2 (A > 0, above 1.2) and 1 (one of two tokens masked out);
    # micro-batch 2: ratios 0.5 (A < 0, below 0.8), 1, 1, 1.
    lp1, old1 = _at_ratios([[2.0, 1.0]])
    first = PPOClip()(lp1, old1, torch.tensor([1.0]), torch.tensor([[1, 0]]))
    lp2, old2 = _at_ratios([[0.5, 1.0], [1.0, 1.0]])
    second = PPOClip()(lp2, old2, torch.tensor([-1.0, 1.0]), torch.ones(2, 2))
    stats = {k: v.item() for k, v in merged_stats([first, second]).items()}
    # 5 real tokens: ratios 2, .5, 1, 1, 1 -> mean 5.5 / 5 = 1.1; one token clipped high, one low
    assert stats == pytest.approx(
        {"ratio_mean": 1.1, "ratio_min": 0.5, "ratio_max": 2.0, "clip_frac_low": 0.2, "clip_frac_high": 0.2}
    )
    # the mean of the two micro-batch means would be (2 + .875) / 2 = 1.4375
    assert _stat(first, "ratio_mean") == pytest.approx(2.0)
    assert _stat(second, "ratio_mean") == pytest.approx(0.875)


def test_merged_stats_without_masks_and_with_extra_stats():
    lp1, old1 = _at_ratios([[4.0, 1.0]])
    lp2, old2 = _at_ratios([[1.0, 1.0]])
    outputs = [PPOClip(dual_clip=3.0)(lp, old, torch.tensor([-1.0]), None) for lp, old in ((lp1, old1), (lp2, old2))]
    stats = merged_stats(outputs)
    assert stats["ratio_mean"].item() == pytest.approx(7.0 / 4.0)
    # dual-clip fraction 1/2 in the first output, 0 in the second: averaged over the outputs
    assert stats["dual_clip_frac"].item() == pytest.approx(0.25)
