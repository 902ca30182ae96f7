"""Stated confidence against correctness: the Brier score, and RLCR's reward built on it.

RLCR (Damani et al. 2025, "Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty",
arXiv:2507.16806) rewards a response that states a confidence `q` in [0, 1] with

    R = 1[correct] - (q - 1[correct])^2

the correctness reward plus minus the Brier score. For a fixed answer its expectation is highest at `q` equal to the
answer's chance of being right, and among calibrated responses at the likeliest answer (the paper's Theorem 1): a
confident guess loses, and a wrong answer stated at confidence 0 (reward 0) never beats a likelier right one.

The Brier score and the expected calibration error measure calibration; AUROC measures discrimination, how well the
stated confidence tells a response's right answers from its wrong ones (0.5: not at all, whatever the calibration).
Both come from sums (`calibration_bins`, `confidence_histogram`) that add over batches and ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def brier_scores(confidence: Tensor, correct: Tensor) -> Tensor:
    """`(q - 1[correct])^2` per row: 0 for a correct answer stated with confidence 1 or a wrong one with 0, 1 for the
    reverse."""
    # Brier 1950, "Verification of forecasts expressed in terms of probability"; RLCR's calibration term
    return (confidence.float() - correct.float()).square()


def rlcr_rewards(confidence: Tensor, correct: Tensor) -> Tensor:
    """`1[correct] - (q - 1[correct])^2` per row (Damani et al. 2025, arXiv:2507.16806)."""
    return correct.float() - brier_scores(confidence, correct)


def calibration_bins(confidence: Tensor, correct: Tensor, bins: int = 10) -> Tensor:
    """`[bins, 3]` per bin of confidence (equal widths, left-closed, 1 in the last): the rows, their summed
    confidence and their correct count; sums over batches and ranks add up."""
    index = (confidence.float() * bins).floor().long().clamp(0, bins - 1)
    rows = torch.stack((torch.ones_like(confidence, dtype=torch.float32), confidence.float(), correct.float()), -1)
    return torch.zeros(bins, 3, dtype=torch.float32, device=confidence.device).index_add_(0, index, rows)


def expected_calibration_error(bin_sums: Tensor) -> Tensor:
    """`sum_b n_b / N |mean confidence_b - accuracy_b|` from `calibration_bins`' sums, 0 without rows."""
    # Naeini et al. 2015 (Bayesian binning); Guo et al. 2017, "On Calibration of Modern Neural Networks"
    count, confidence, correct = bin_sums.unbind(-1)
    return (confidence - correct).abs().sum() / count.sum().clamp_min(1.0)


def confidence_histogram(confidence: Tensor, correct: Tensor, levels: int = 1000) -> Tensor:
    """`[levels + 1, 2]`: per confidence rounded to the nearest `1 / levels`, the wrong and the right rows; sums over
    batches and ranks add up."""
    index = (confidence.float() * levels).round().long().clamp(0, levels)
    rows = torch.stack((~correct.bool(), correct.bool()), -1).float()
    return torch.zeros(levels + 1, 2, dtype=torch.float32, device=confidence.device).index_add_(0, index, rows)


def auroc(histogram: Tensor) -> Tensor:
    """The area under the ROC curve of confidence against correctness from `confidence_histogram`'s counts: the chance
    that a right row states more confidence than a wrong one, ties counting half; NaN without both kinds of row."""
    # Hanley & McNeil 1982: the AUROC equals the Mann-Whitney U statistic over (right, wrong) pairs
    wrong, right = histogram.double().unbind(-1)
    wrong_below = wrong.cumsum(0) - wrong
    pairs = right.sum() * wrong.sum()
    area = (right * (wrong_below + 0.5 * wrong)).sum() / pairs
    return area.float() if pairs > 0 else torch.tensor(float("nan"))


__all__ = [
    "auroc",
    "brier_scores",
    "calibration_bins",
    "confidence_histogram",
    "expected_calibration_error",
    "rlcr_rewards",
]
