"""A task whose answers are sometimes a guess, for learning to state a calibrated confidence (RLCR's
`CalibrationReward`) on the tiny Llama of `named_digit`.

Half the prompts accept any digit (`"c a any"`: every answer that is a digit is right); the other half ask for a
guess (`"b guess"`: the answer is a digit drawn at random, so no answer is right more than about one time in ten). A
response is the answer and a confidence word, `"7 0.9"` (the words "0.0", "0.1", ..., "1.0" are in the vocabulary).
`GuessReward` says whether the answer is right; `CalibrationReward` (reading `CONFIDENCE_PATTERN`) scores minus the
Brier score of the confidence. A calibrated model states 1.0 after "any" and about 0.1 after "guess".

    tokenizer_dir = save_word_tokenizer(path, STATED_WORDS)
    cli, curve = fit(fit_config(tokenizer_dir, seed=0), tmp_path)
    stated_confidence(cli.model.policy)             # {"any": mean stated, "guess": mean stated}, greedily
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from rlvr_lightning.data.inline_task import InlineTask
from rlvr_lightning.demos import named_digit
from rlvr_lightning.demos.named_digit import DIGITS, FILLER, WORDS, RewardCurve, fit, save_word_tokenizer
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.calibration import parse_confidence

CONFIDENCES = [f"{tenth / 10:.1f}" for tenth in range(11)]
STATED_WORDS = [*WORDS, "any", "guess", *CONFIDENCES]
CONFIDENCE_PATTERN = r"^\s*\d\s+([01]\.\d)\s*$"  # a digit, then the confidence: nothing else
RESPONSE_LENGTH = 2  # the answer and the confidence


def examples(count: int, seed: int) -> list[dict[str, Any]]:
    """`InlineTask` examples, "any" and "guess" prompts alternating: {"prompt": "b guess", "answer": "3",
    "kind": "guess"}."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        digit, filler = rng.choice(DIGITS), rng.choices(FILLER, k=rng.randint(0, 3))
        kind = "any" if i % 2 == 0 else "guess"
        out.append({"prompt": " ".join([*filler, kind]), "answer": digit, "kind": kind})
    return out


TRAIN_EXAMPLES = examples(200, seed=0)
VAL_EXAMPLES = examples(100, seed=1)


class StatedConfidenceTask(InlineTask):
    """The training examples, streamed in a seeded order, and the held-out ones as the validation set."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(TRAIN_EXAMPLES, val_examples=VAL_EXAMPLES, seed=seed)


class GuessReward(RewardCallback):
    """1 when the response starts with a digit and the prompt is "any" or the digit is the drawn answer, else 0."""

    def score_row(self, rollout, i: int) -> float:
        words = rollout.response_text[i].split()
        metadata = rollout.metadata[i]
        digit = words[0] if words and words[0] in DIGITS else None
        return float(digit is not None and (metadata["kind"] == "any" or digit == metadata["answer"]))

    def is_correct(self, rollout, scores):
        return scores == 1


def fit_config(tokenizer_dir: str | Path, seed: int, steps: int = 60, calibration_weight: float = 1.0) -> dict:
    """`named_digit.fit_config`'s GRPO run on this task, rewarded by `GuessReward` and `CalibrationReward` (at
    `calibration_weight`; 0 keeps its metrics and trains on the answer alone)."""
    config = named_digit.fit_config(tokenizer_dir, seed, steps=steps)
    config["model"]["init_args"]["sampling"]["max_new_tokens"] = RESPONSE_LENGTH
    config["trainer"]["callbacks"][0] = {"class_path": f"{__name__}.GuessReward", "init_args": {"on_error": "raise"}}
    calibration = {"pattern": CONFIDENCE_PATTERN, "weight": calibration_weight, "on_error": "raise"}
    config["trainer"]["callbacks"].insert(
        1, {"class_path": "rlvr_lightning.rewards.CalibrationReward", "init_args": calibration}
    )
    config["data"]["init_args"]["task"] = {
        "class_path": f"{__name__}.StatedConfidenceTask",
        "init_args": {"seed": seed},
    }
    return config


@torch.no_grad()
def stated_confidence(policy, val_examples: list[dict[str, Any]] = VAL_EXAMPLES) -> dict[str, float]:
    """The mean confidence the greedy responses to the held-out "any" and "guess" prompts state (a response that
    states none counts as 0.5)."""
    from rlvr_lightning.generation.sampling_config import SamplingConfig

    batch = {"prompt": [e["prompt"] for e in val_examples], "metadata": [dict(e) for e in val_examples]}
    rollout = policy.sample(batch, 1, SamplingConfig(do_sample=False, max_new_tokens=RESPONSE_LENGTH))
    stated: dict[str, list[float]] = {"any": [], "guess": []}
    for example, text in zip(val_examples, rollout.response_text, strict=True):
        value = parse_confidence(text, CONFIDENCE_PATTERN)
        stated[example["kind"]].append(0.5 if value is None else value)
    return {kind: sum(values) / len(values) for kind, values in stated.items()}


__all__ = [
    "STATED_WORDS",
    "GuessReward",
    "RewardCurve",
    "StatedConfidenceTask",
    "fit",
    "fit_config",
    "save_word_tokenizer",
    "stated_confidence",
]
