"""How fast and how right is the language consistency reward?

Scores 1,000 synthetic chains of thought with `LanguageConsistencyReward(language="en")` under each
judge: the Unicode-script fallback, py3langid over all its languages, and py3langid restricted to
the languages the completions use. The completions (seeded) are reasoning sentences in English,
French and Chinese: 40% English only, 20% French only, 20% English with French sentences, 20%
English with Chinese sentences; the true share of English words is known sentence by sentence.

The judges are timed in interleaved rounds (each round times every judge once, in turn), so a
busy machine slows them alike; printed: the median seconds per 1,000 completions, the one-off
model load, and the error against the true share (mean absolute, and how many French-only
completions score above 0.5).

    python scripts/bench_language_id.py                 # 1,000 completions, 5 rounds
    python scripts/bench_language_id.py --rows 2000 --rounds 9
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from rlvr_lightning.rewards.language import LanguageConsistencyReward  # noqa: E402
from rlvr_lightning.rewards.language_scripts import script_words  # noqa: E402
from rlvr_lightning.rollout import Rollout  # noqa: E402

ENGLISH = [
    "First we add the units, then we add the tens.",
    "Let me check this again carefully.",
    "The problem asks for the total number of apples.",
    "We know that each box holds twelve eggs.",
    "So the answer must be larger than fifty.",
    "Multiply both sides of the equation by two.",
    "Wait, that does not look right, so I will start over.",
    "Subtract the cost of the pens from the money she had.",
    "This gives us the price of one ticket.",
    "Therefore the remaining distance is forty kilometres.",
    "Now divide the result by the number of friends.",
    "I need to be careful with the units here.",
]
FRENCH = [
    "D'abord on additionne les unités, puis les dizaines.",
    "Vérifions cela encore une fois avec soin.",
    "Le problème demande le nombre total de pommes.",
    "On sait que chaque boîte contient douze oeufs.",
    "Donc la réponse doit être plus grande que cinquante.",
    "Multiplions les deux côtés de l'équation par deux.",
    "Attendez, cela ne semble pas juste, je recommence.",
    "On soustrait le prix des stylos de l'argent qu'elle avait.",
    "Cela nous donne le prix d'un billet.",
    "La distance restante est donc de quarante kilomètres.",
    "Maintenant on divise le résultat par le nombre d'amis.",
    "Il faut faire attention aux unités ici.",
]
CHINESE = ["我们先把个位数相加。", "让我再检查一遍。", "所以答案是四十二。", "现在把结果除以朋友的人数。"]


def completion(rng: random.Random) -> tuple[str, float, bool]:
    """A chain of thought of 6 to 10 sentences, its true share of English words, and whether it is all French."""
    kind = rng.choices(["en", "fr", "en+fr", "en+zh"], weights=[4, 2, 2, 2])[0]
    sentences: list[tuple[str, bool]] = []
    for _ in range(rng.randint(6, 10)):
        if kind == "en" or (kind != "fr" and rng.random() < 0.6):
            sentences.append((rng.choice(ENGLISH), True))
        elif kind in ("fr", "en+fr"):
            sentences.append((rng.choice(FRENCH), False))
        else:
            sentences.append((rng.choice(CHINESE), False))
    english = sum(len(script_words(s)) for s, is_english in sentences if is_english)
    total = sum(len(script_words(s)) for s, _ in sentences)
    text = "<think> " + " ".join(s for s, _ in sentences) + " </think> <answer> 42 </answer>"
    return text, english / total, kind == "fr"


def text_rollout(texts: list[str]) -> Rollout:
    return Rollout.from_texts(texts, "prompt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    rng = random.Random(args.seed)
    rows = [completion(rng) for _ in range(args.rows)]
    rollout = text_rollout([text for text, _, _ in rows])
    truth = torch.tensor([share for _, share, _ in rows])
    french_only = torch.tensor([fr for _, _, fr in rows])

    legs: dict[str, LanguageConsistencyReward] = {}
    load_s: dict[str, float] = {}
    for name, kwargs in [
        ("script (fallback)", {"detector": "script"}),
        ("py3langid, all languages", {"detector": "py3langid"}),
        ("py3langid, languages [en, fr, zh]", {"detector": "py3langid", "languages": ["en", "fr", "zh"]}),
    ]:
        start = time.perf_counter()
        legs[name] = LanguageConsistencyReward(language="en", **kwargs)
        load_s[name] = time.perf_counter() - start

    seconds: dict[str, list[float]] = {name: [] for name in legs}
    scores: dict[str, torch.Tensor] = {}
    for _ in range(args.rounds):
        for name, reward in legs.items():
            start = time.perf_counter()
            scores[name] = reward(rollout)
            seconds[name].append(time.perf_counter() - start)
            assert reward.pop_errors() == 0

    per_1000 = 1000 / args.rows
    print(
        f"{args.rows} completions, "
        f"mean {sum(len(script_words(t)) for t in rollout.response_text) / args.rows:.0f} words each; "
        f"median of {args.rounds} interleaved rounds; one thread"
    )
    print(
        f"{'judge':36s} {'s / 1000 completions':>21s} {'load s':>7s} {'mean |error|':>13s} {'French-only > 0.5':>18s}"
    )
    for name in legs:
        error = (scores[name] - truth).abs().mean().item()
        fooled = int((scores[name][french_only] > 0.5).sum())
        print(
            f"{name:36s} {statistics.median(seconds[name]) * per_1000:21.3f} {load_s[name]:7.2f} {error:13.3f} "
            f"{fooled:>10d} of {int(french_only.sum())}"
        )


if __name__ == "__main__":
    main()
