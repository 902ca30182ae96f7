"""`LanguageConsistencyReward`: the share of the chain of thought written in the target language.

DeepSeek-R1 (DeepSeek-AI 2025, section 2.3.2) adds "a language consistency reward during RL
training, which is calculated as the proportion of target language words in the CoT", because
R1-Zero's reasoning mixed languages.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.rewards.language.LanguageConsistencyReward
          init_args: {language: en, languages: [en, fr, zh], weight: 0.1}

Two judges of a word's language (`detector`):

* ``py3langid``: a language identifier from PyPI (``pip install 'rlvr-lightning[language]'``; its
  model ships in the wheel), sentence by sentence: tells English from French
  (`rewards.language_id`). `languages` restricts the candidates (recommended: the languages you
  expect; default all 97 it knows), `min_words` is the shortest chunk it is asked about;
* ``script``: by Unicode script, no dependency (`rewards.language_scripts`): tells English from
  Chinese, Russian or Arabic, but languages that share a script are one language to it;
* ``auto`` (default): py3langid when it is installed, else the script judge, with a warning.

The score is (words in the target language) / (all words), in [0, 1]. The chain of thought is the
content of the ``<think>`` block when there is one (with the R1-Zero template, whose prompt opens
the block, everything before ``</think>``), else the whole response.
"""

from __future__ import annotations

import warnings

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.language_id import INSTALL_HINT, LangidDetector, langid_available
from rlvr_lightning.rewards.language_scripts import LANGUAGE_SCRIPTS, language_share, script_words
from rlvr_lightning.rewards.math import response_texts
from rlvr_lightning.rollout import Rollout

DETECTORS = ("auto", "py3langid", "script")


def chain_of_thought(text: str) -> str:
    """The think-block content if there is one, else the whole text."""
    close = text.find("</think>")
    if close < 0:
        return text
    opening = text.rfind("<think>", 0, close)
    return text[opening + len("<think>") : close] if opening >= 0 else text[:close]


class ScriptDetector:
    """Share of the words in the target language's script(s) (`rewards.language_scripts`)."""

    name = "script"

    def __init__(self, language: str) -> None:
        if language not in LANGUAGE_SCRIPTS:
            raise ValueError(f"language {language!r} is not supported; choose one of {sorted(LANGUAGE_SCRIPTS)}")
        self.scripts = LANGUAGE_SCRIPTS[language]

    def share(self, text: str, empty_score: float = 0.0) -> float:
        return language_share(text, self.scripts, empty_score)


def make_detector(detector: str, language: str, languages: list[str] | None, min_words: int):
    if detector not in DETECTORS:
        raise ValueError(f"detector={detector!r} is not one of {DETECTORS}")
    if detector == "script" or (detector == "auto" and not langid_available()):
        if detector == "auto":
            warnings.warn(
                "LanguageConsistencyReward: py3langid is not installed, so words are judged by Unicode script "
                f"and languages sharing a script (English, French) are not told apart; {INSTALL_HINT}",
                stacklevel=3,
            )
        return ScriptDetector(language)
    return LangidDetector(language, languages=languages, min_words=min_words)


class LanguageConsistencyReward(RewardCallback):
    """Share of the chain-of-thought words written in the target language (see the module docstring)."""

    kind = "shaping"

    def __init__(
        self,
        language: str = "en",
        detector: str = "auto",
        languages: list[str] | None = None,
        min_words: int = 5,
        think_only: bool = True,
        empty_score: float = 0.0,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            language: target language code (one of `LANGUAGE_SCRIPTS`).
            detector: "auto", "py3langid" or "script" (module docstring).
            languages: py3langid's candidate languages (None: every language it knows).
            min_words: py3langid is asked about chunks of at least this many words (shorter text is merged).
            think_only: score the ``<think>`` block when there is one (True) or always the whole response.
            empty_score: the score of a chain of thought with no words at all.
        """
        super().__init__(weight=weight, name=name or "language_consistency", on_error=on_error)
        self.language = language
        self.detector = make_detector(detector, language, languages, min_words)
        self.think_only = think_only
        self.empty_score = empty_score

    def score_row(self, rollout: Rollout, i: int) -> float:
        text = response_texts(rollout, type(self).__name__)[i]
        return self.detector.share(chain_of_thought(text) if self.think_only else text, self.empty_score)


__all__ = [
    "DETECTORS",
    "LANGUAGE_SCRIPTS",
    "LanguageConsistencyReward",
    "ScriptDetector",
    "chain_of_thought",
    "language_share",
    "make_detector",
    "script_words",
]
