"""Stated confidence against correctness: the Brier score, and RLCR's reward built on it.

RLCR (Damani et al. 2025, "Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty",
arXiv:2507.16806) rewards a response that states a confidence `q` in [0, 1] with

    R = 1[correct] - (q - 1[correct])^2

the correctness reward plus minus the Brier score. For a fixed answer its expectation is highest at `q` equal to the
answer's chance of being right, and among calibrated responses at the likeliest answer (the paper's Theorem 1): a
confident guess loses, and a wrong answer stated at confidence 0 (reward 0) never beats a likelier right one.
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


__all__ = ["brier_scores", "calibration_bins", "expected_calibration_error", "rlcr_rewards"]
