"""SPO's value tracker (arXiv:2509.13232): each function by hand, and a run of the authors' tracker and advantage
(`spo_ray_trainer.fit` and `_get_spo_rho`, verl-project/verl-recipe 48ea0a7), restated, against ours."""

import random

import pytest
import torch

from rlvr_lightning.core import value_tracker as tracker


def test_initial_tracker_by_hand():
    alpha, beta = tracker.initial_tracker(torch.tensor([3.0, 0.0]), samples=8, rho_min=0.875)
    # N0 = 1 / (1 - 0.875) = 8: alpha = 8 (3 + 1/2) / 9, beta = 8 (8 - 3 + 1/2) / 9; none of 8: 8 (1/2) / 9, 8 (8.5) / 9
    assert alpha.tolist() == pytest.approx([28 / 9, 4 / 9])
    assert beta.tolist() == pytest.approx([44 / 9, 68 / 9])
    assert (alpha + beta).tolist() == pytest.approx([8.0, 8.0])  # the effective count the forgetting settles at
    half, other = tracker.initial_tracker(torch.tensor([5.0]), samples=0, rho_min=0.875)
    assert (half.item(), other.item()) == (0.5, 0.5)


def test_forgetting_rate_by_hand():
    drift = torch.tensor([0.0, 0.01, 0.06, 1.0])
    rho = tracker.forgetting_rate(drift, d_half=0.06, rho_min=0.875, rho_max=0.96)
    # 2^0 = 1 -> 0.96; 2^(-1/6) = 0.8909; 2^-1 = 0.5 -> 0.875; 2^(-16.7) -> 0.875
    assert rho.tolist() == pytest.approx([0.96, 2 ** (-1 / 6), 0.875, 0.875])


def test_tracked_and_the_drift_by_hand():
    alpha, beta = tracker.tracked(torch.tensor(3.0), torch.tensor(1.0), torch.tensor(0.9), torch.tensor(1.0))
    assert (alpha.item(), beta.item()) == pytest.approx((3.7, 0.9))
    # a group of 4 with rewards summing to 2.5: 4 observations
    alpha, beta = tracker.tracked(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0.5), torch.tensor(2.5), 4)
    assert (alpha.item(), beta.item()) == pytest.approx((3.0, 2.0))
    then = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    now = torch.tensor([[-1.5, -1.0, -9.0], [-0.25, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert tracker.mean_abs_log_ratio(then, now, mask).tolist() == pytest.approx([0.75, 0.25])


def test_single_stream_advantages_by_hand():
    rewards, values = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.5, 0.5, 0.9, 0.1])
    # r - p = 0.5, -0.5, 0.1, -0.1: mean 0, unbiased std sqrt((0.25 + 0.25 + 0.01 + 0.01) / 3)
    std = ((0.52 / 3) ** 0.5) + 1e-8
    expected = [0.5 / std, -0.5 / std, 0.1 / std, -0.1 / std]
    assert tracker.single_stream_advantages(rewards, values).tolist() == pytest.approx(expected)
    assert tracker.single_stream_advantages(torch.tensor([1.0]), torch.tensor([0.2])).tolist() == [0.0]


def authors_step(prompts, r, prompt2alpha, prompt2beta, D, rho_min=0.875):
    """verl-recipe spo/spo_ray_trainer.py, the advantage (before the update) and the tracker update (after it, with
    `_get_spo_rho`'s rho from the drift D), restated."""
    alpha = torch.tensor([prompt2alpha[p] for p in prompts], dtype=torch.float)
    beta = torch.tensor([prompt2beta[p] for p in prompts], dtype=torch.float)
    p_hats = alpha / (alpha + beta)
    advantages = r - p_hats
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    rho = torch.clamp(torch.pow(2.0, -D / torch.as_tensor(0.06)), min=rho_min, max=0.96)
    alpha, beta = rho * alpha + r, rho * beta + (1 - r)
    for i, p in enumerate(prompts):
        prompt2alpha[p], prompt2beta[p] = alpha[i].item(), beta[i].item()
    return advantages


def test_equals_the_authors_tracker_over_a_run():
    rng = random.Random(0)
    pool = [f"prompt {i}" for i in range(30)]
    scores = {p: [rng.random() < 0.4 for _ in range(8)] for p in pool}  # the offline responses
    n0 = 1 / (1 - 0.875)
    authors_alpha = {p: n0 * (sum(scores[p]) + 0.5) / 9 for p in pool}
    authors_beta = {p: n0 * (8 - sum(scores[p]) + 0.5) / 9 for p in pool}
    alpha0, beta0 = tracker.initial_tracker(torch.tensor([float(sum(scores[p])) for p in pool]), 8, 0.875)
    ours = {p: (a, b) for p, a, b in zip(pool, alpha0.tolist(), beta0.tolist(), strict=True)}
    for _ in range(40):
        prompts = rng.sample(pool, 10)
        r = torch.tensor([float(rng.random() < 0.5) for _ in prompts])
        drift = torch.rand(10, generator=torch.Generator().manual_seed(rng.randrange(1000))) * 0.1
        expected = authors_step(prompts, r, authors_alpha, authors_beta, drift)
        alpha = torch.tensor([ours[p][0] for p in prompts], dtype=torch.float64)
        beta = torch.tensor([ours[p][1] for p in prompts], dtype=torch.float64)
        advantages = tracker.single_stream_advantages(r.double(), alpha / (alpha + beta))
        assert torch.allclose(advantages.float(), expected, atol=1e-5)
        rho = tracker.forgetting_rate(drift.double(), 0.06, 0.875, 0.96)
        alpha, beta = tracker.tracked(alpha, beta, rho, r.double())
        ours.update({p: (a, b) for p, a, b in zip(prompts, alpha.tolist(), beta.tolist(), strict=True)})
    for p in pool:
        assert ours[p] == pytest.approx((authors_alpha[p], authors_beta[p]), rel=1e-5)


def test_sampling_weights_by_hand():
    values = torch.tensor([0.5, 0.0, 1.0, 0.9], dtype=torch.float64)
    # sqrt(p (1 - p)) + 0.05: sqrt(0.25) = 0.5; 0; 0; sqrt(0.09) = 0.3
    assert tracker.sampling_weights(values, 0.05).tolist() == pytest.approx([0.55, 0.05, 0.05, 0.35])


def test_sampling_weights_equal_the_authors():
    """verl-recipe spo/spo_ray_trainer.py, `prompt2phat` and `prompt2weight` (EXPLORATION_EPSILON 0.05), restated."""
    random.seed(0)
    prompt2alpha = {f"p{i}": random.uniform(0.01, 9.0) for i in range(50)}
    prompt2beta = {f"p{i}": random.uniform(0.01, 9.0) for i in range(50)}
    prompt2phat = {k: float(prompt2alpha[k]) / float(prompt2alpha[k] + prompt2beta[k]) for k in prompt2alpha}
    prompt2weight = {k: ((prompt2phat[k] * (1.0 - prompt2phat[k])) ** 0.5) + 0.05 for k in prompt2alpha}
    alpha = torch.tensor(list(prompt2alpha.values()), dtype=torch.float64)
    beta = torch.tensor(list(prompt2beta.values()), dtype=torch.float64)
    ours = tracker.sampling_weights(alpha / (alpha + beta), 0.05)
    assert ours.tolist() == pytest.approx(list(prompt2weight.values()), abs=1e-12)


def inclusion_by_hand(weights, keep):
    """P(prompt i is drawn) when `keep` draws are made one after another, each in proportion to the weights left."""
    inclusion = [0.0] * len(weights)

    def walk(left, chosen, probability):
        if len(chosen) == keep:
            for i in chosen:
                inclusion[i] += probability
            return
        total = sum(weights[i] for i in left)
        for i in left:
            walk([j for j in left if j != i], chosen + [i], probability * weights[i] / total)

    walk(list(range(len(weights))), [], 1.0)
    return inclusion


def test_prioritized_draw_keeps_each_prompt_as_often_as_sequential_draws_would():
    weights = torch.tensor([0.55, 0.05, 0.35, 0.2, 0.45], dtype=torch.float64)
    # e.g. with 2 draws from 3 weights (1, 1, 2): P(the third) = 2/4 + 2 (1/4)(2/3) = 5/6
    assert inclusion_by_hand([1.0, 1.0, 2.0], 2)[2] == pytest.approx(5 / 6)
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([tracker.prioritized_draw(weights, 2, generator) for _ in range(40_000)])
    assert bool((draws[:, 0] < draws[:, 1]).all())  # distinct, in ascending order
    frequency = torch.bincount(draws.flatten(), minlength=5).double() / 40_000
    assert frequency.tolist() == pytest.approx(inclusion_by_hand(weights.tolist(), 2), abs=0.01)
    with pytest.raises(ValueError, match="cannot draw 6 prompts without replacement from 5"):
        tracker.prioritized_draw(weights, 6)
