"""How often does a config's generative judge agree with hand labels?

Builds the `GenerativeJudgeReward` of a config (its first one under `trainer.callbacks`, judge model
included) and scores 12 hand-labelled one-sentence reviews, 6 positive and 6 negative, in one batch.
Prints each review, its label and the judge's score, the agreement (a score of at least 0.5 is a
"positive" verdict), how many answers could not be parsed, and the judge's seconds per review.

    python scripts/judge_agreement.py configs/smollm2_judge.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import yaml  # noqa: E402
from jsonargparse import ArgumentParser  # noqa: E402

from rlvr_lightning.rewards.judge import GenerativeJudgeReward  # noqa: E402
from rlvr_lightning.rollout import Rollout  # noqa: E402

REVIEWS = [
    ("I loved this movie, it was wonderful and fun.", 1),
    ("Terrible film. Boring and way too long.", 0),
    ("What a great day, everything went perfectly!", 1),
    ("I hate this product, it broke after one day.", 0),
    ("The food was delicious and the staff were kind.", 1),
    ("Awful service, I will never come back.", 0),
    ("The hotel has become a haven for public unrest, with loud music and numerous noisy guests.", 0),
    ("The train journey was incredibly cramped, with two hours of delay.", 0),
    ("A small, affordable restaurant serves a relaxing and comforting meal.", 1),
    ("The room was dirty and the staff were rude.", 0),
    ("Great phone, the battery lasts for days.", 1),
    ("The concert was fantastic and the sound was perfect.", 1),
]


def judge_from_config(path: Path) -> GenerativeJudgeReward:
    config = yaml.safe_load(path.read_text())
    entries = [
        cb
        for cb in config.get("trainer", {}).get("callbacks", [])
        if cb.get("class_path", "").endswith("GenerativeJudgeReward")
    ]
    if not entries:
        raise SystemExit(f"{path} has no GenerativeJudgeReward under trainer.callbacks")
    parser = ArgumentParser()
    parser.add_argument("--reward", type=GenerativeJudgeReward)
    config = parser.parse_object({"reward": entries[0]})
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # jsonargparse < 4.49
    return instantiate(config).reward


def text_rollout(texts: list[str]) -> Rollout:
    return Rollout.from_texts(texts, "Write a one-sentence review.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    reward = judge_from_config(args.config)
    reward.batch_size = len(REVIEWS)
    start = time.perf_counter()
    scores = reward(text_rollout([text for text, _ in REVIEWS])).tolist()
    seconds = time.perf_counter() - start
    errors = reward.pop_errors()
    agree = 0
    for (text, label), score in zip(REVIEWS, scores, strict=True):
        agree += int((score >= 0.5) == bool(label))
        print(f"label {'positive' if label else 'negative'}  score {score:.2f}  {text}")
    called_positive = sum(score >= 0.5 for score in scores)
    print(
        f"agreement {agree}/{len(REVIEWS)}; called positive {called_positive}/{len(REVIEWS)}; "
        f"unparsed answers {errors}; {seconds / len(REVIEWS):.2f} s per review (one batch, one thread)"
    )


if __name__ == "__main__":
    main()
