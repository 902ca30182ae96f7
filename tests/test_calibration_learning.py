"""RLCR's calibration reward teaches the tiny Llama to state how likely its answer is right
(`rlvr_lightning/demos/stated_confidence.py`): after "any" (every digit is right) it states 1.0, after "guess" (one
digit in ten is) at most 0.3, greedily on held-out prompts, within 60 GRPO steps. The same run trained on the answer
alone states no confidence, and one whose calibration reward reads the verdicts reversed states them backwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr_lightning.demos.stated_confidence import STATED_WORDS, fit, fit_config, save_word_tokenizer, stated_confidence
from rlvr_lightning.rewards.calibration import CalibrationReward


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return save_word_tokenizer(tmp_path_factory.mktemp("stated_words"), STATED_WORDS)


def calibrated(cli) -> bool:
    stated = stated_confidence(cli.model.policy)
    metrics = cli.trainer.callback_metrics
    ece, share = float(metrics["train/rewards/calibration/ece"]), float(metrics["train/rewards/calibration/stated"])
    return stated["any"] >= 0.8 and stated["guess"] <= 0.3 and ece <= 0.25 and share >= 0.9


@pytest.mark.parametrize("seed", [0, 1])
def test_rlcr_learns_to_state_a_calibrated_confidence(tokenizer_dir, tmp_path, seed):
    cli, _ = fit(fit_config(tokenizer_dir, seed, steps=60), tmp_path)
    assert calibrated(cli), (stated_confidence(cli.model.policy), dict(cli.trainer.callback_metrics))


def _verdicts_reversed(monkeypatch):
    correct = CalibrationReward.correct
    monkeypatch.setattr(CalibrationReward, "correct", lambda self, rollout: ~correct(self, rollout))


@pytest.mark.parametrize("broken", ["answer_alone", "verdicts_reversed"])
def test_without_the_calibration_reward_the_confidence_is_not_calibrated(tokenizer_dir, tmp_path, monkeypatch, broken):
    if broken == "verdicts_reversed":
        _verdicts_reversed(monkeypatch)
    weight = 0.0 if broken == "answer_alone" else 1.0
    cli, _ = fit(fit_config(tokenizer_dir, 0, steps=60, calibration_weight=weight), tmp_path)
    assert not calibrated(cli), stated_confidence(cli.model.policy)
