"""The Brier score, RLCR's reward and the expected calibration error, by hand and against torchmetrics."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core.calibration import (
    auroc,
    brier_scores,
    calibration_bins,
    confidence_histogram,
    expected_calibration_error,
    rlcr_rewards,
)


def test_brier_scores_and_rlcr_rewards_by_hand():
    confidence = torch.tensor([1.0, 0.0, 0.7, 0.7, 0.0, 1.0])
    correct = torch.tensor([True, False, True, False, True, False])
    # (q - c)^2: 0, 0, 0.09, 0.49, 1, 1
    torch.testing.assert_close(brier_scores(confidence, correct), torch.tensor([0.0, 0.0, 0.09, 0.49, 1.0, 1.0]))
    # 1[c] - (q - c)^2: 1, 0, 0.91, -0.49, 0, -1
    torch.testing.assert_close(rlcr_rewards(confidence, correct), torch.tensor([1.0, 0.0, 0.91, -0.49, 0.0, -1.0]))


def test_rlcr_reward_is_highest_in_expectation_at_the_answers_chance():
    """Theorem 1's first half: with the answer right with probability p, E[R] over q peaks at q = p."""
    q = torch.linspace(0, 1, 101)
    for p in (0.1, 0.5, 0.9):
        expected = p * rlcr_rewards(q, torch.ones_like(q)) + (1 - p) * rlcr_rewards(q, torch.zeros_like(q))
        assert q[expected.argmax()].item() == pytest.approx(p)


def test_expected_calibration_error_by_hand():
    # bins of 0.1, left-closed: 0.95 -> [0.9, 1], 0.85 -> [0.8, 0.9), 0.25 and 0.22 -> [0.2, 0.3)
    confidence = torch.tensor([0.95, 0.85, 0.25, 0.22])
    correct = torch.tensor([1, 0, 0, 1])
    bins = calibration_bins(confidence, correct)
    assert bins[9].tolist() == pytest.approx([1, 0.95, 1]) and bins[2].tolist() == pytest.approx([2, 0.47, 1])
    # (|0.95 - 1| * 1 + |0.85 - 0| * 1 + |0.235 - 0.5| * 2) / 4 = (0.05 + 0.85 + 0.53) / 4
    assert expected_calibration_error(bins).item() == pytest.approx(0.3575)
    assert calibration_bins(torch.tensor([1.0, 0.0]), torch.tensor([1, 0]))[[0, 9], 0].tolist() == [1, 1]
    assert expected_calibration_error(torch.zeros(10, 3)).item() == 0


def test_expected_calibration_error_equals_torchmetrics_and_adds_over_batches():
    from torchmetrics.functional.classification import binary_calibration_error

    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        confidence = torch.rand(64, generator=generator)
        confidence[:3] = torch.tensor([0.0, 1.0, 0.5])
        correct = (torch.rand(64, generator=generator) < confidence).long()
        ece = expected_calibration_error(calibration_bins(confidence, correct))
        torch.testing.assert_close(ece, binary_calibration_error(confidence, correct, n_bins=10, norm="l1"))
        halves = calibration_bins(confidence[:30], correct[:30]) + calibration_bins(confidence[30:], correct[30:])
        torch.testing.assert_close(expected_calibration_error(halves), ece)


def test_auroc_by_hand():
    # right at 0.9 and 0.6, wrong at 0.6 and 0.2: pairs (0.9, 0.6) 1, (0.9, 0.2) 1, (0.6, 0.6) 1/2, (0.6, 0.2) 1
    confidence = torch.tensor([0.9, 0.6, 0.6, 0.2])
    correct = torch.tensor([True, True, False, False])
    assert auroc(confidence_histogram(confidence, correct)).item() == pytest.approx(3.5 / 4)
    # a constant confidence tells nothing: 1/2; reversed: 0; without a wrong row: undefined
    assert auroc(confidence_histogram(torch.full((4,), 0.4), correct)).item() == pytest.approx(0.5)
    assert auroc(confidence_histogram(1 - confidence, correct)).item() == pytest.approx(0.5 / 4)
    assert auroc(confidence_histogram(confidence, torch.ones(4, dtype=torch.bool))).isnan()


def test_auroc_equals_torchmetrics_and_adds_over_batches():
    from torchmetrics.functional.classification import binary_auroc

    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        confidence = (torch.rand(64, generator=generator) * 20).round() / 20  # stated confidences repeat
        correct = (torch.rand(64, generator=generator) < confidence).long()
        correct[:2] = torch.tensor([0, 1])
        area = auroc(confidence_histogram(confidence, correct))
        torch.testing.assert_close(area, binary_auroc(confidence, correct))
        halves = confidence_histogram(confidence[:30], correct[:30]) + confidence_histogram(
            confidence[30:], correct[30:]
        )
        torch.testing.assert_close(auroc(halves), area)
