"""`LanguageConsistencyReward`: the share of the chain of thought written in the target language.

DeepSeek-R1 (DeepSeek-AI 2025, section 2.3.2) adds "a language consistency reward during RL
training, which is calculated as the proportion of target language words in the CoT", because
R1-Zero's reasoning mixed languages.

Here a word's language is judged by its Unicode script, with no dictionary and no dependency:
a word is a maximal run of letters; CJK ideographs, kana and Thai characters count one word each
(those scripts do not separate words by spaces); digits, symbols, LaTeX commands (``\\frac``)
and the ``<think>``/``<answer>`` tags count as nothing. The score is
(words in the target language's scripts) / (all words), in [0, 1]. It therefore tells English
from Chinese, Russian or Arabic, but not English from French: languages that share a script are
one language to it.

The chain of thought is the content of the ``<think>`` block when there is one (with the R1-Zero
template, whose prompt opens the block, everything before ``</think>``), else the whole response.
"""

from __future__ import annotations

import re
import unicodedata

import torch
from torch import Tensor

from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rewards.math import response_texts
from rlvr_lightning.rollout import Rollout

#: scripts (first word of the Unicode character name) of each supported language code
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **{code: frozenset({"LATIN"}) for code in "en fr de es it pt nl sv da no fi pl cs ro hu tr id vi".split()},
    "zh": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL", "CJK"}),
    **{code: frozenset({"CYRILLIC"}) for code in "ru uk bg sr be kk".split()},
    "ar": frozenset({"ARABIC"}),
    "fa": frozenset({"ARABIC"}),
    "el": frozenset({"GREEK"}),
    "he": frozenset({"HEBREW"}),
    "hi": frozenset({"DEVANAGARI"}),
    "th": frozenset({"THAI"}),
}
# Scripts written without spaces between words: every character is a word.
_CHARACTER_SCRIPTS = frozenset({"CJK", "HIRAGANA", "KATAKANA", "THAI"})
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_FORMAT_TAG = re.compile(r"</?(?:think|answer)>", re.IGNORECASE)


def _script(char: str) -> str | None:
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    if not name:
        return None
    script = name.split(" ", 1)[0]
    if script == "FULLWIDTH":  # Ａ is Latin
        return "LATIN" if "LATIN" in name else None
    return script


def script_words(text: str) -> list[str]:
    """The script of every word of `text` (see the module docstring for what a word is)."""
    text = _FORMAT_TAG.sub(" ", _LATEX_COMMAND.sub(" ", text))
    words: list[str] = []
    current: str | None = None
    for char in text:
        script = _script(char)
        if script is None:
            current = None
            continue
        if script in _CHARACTER_SCRIPTS:
            words.append(script)
            current = None
        elif script != current:
            words.append(script)
            current = script
    return words


def chain_of_thought(text: str) -> str:
    """The think-block content if there is one, else the whole text."""
    close = text.find("</think>")
    if close < 0:
        return text
    opening = text.rfind("<think>", 0, close)
    return text[opening + len("<think>") : close] if opening >= 0 else text[:close]


def language_share(text: str, scripts: frozenset[str], empty_score: float = 0.0) -> float:
    words = script_words(text)
    if not words:
        return empty_score
    return sum(1 for w in words if w in scripts) / len(words)


class LanguageConsistencyReward(RewardCallback):
    """Share of the chain-of-thought words written in the target language's script(s)."""

    kind = "shaping"

    def __init__(
        self,
        language: str = "en",
        think_only: bool = True,
        empty_score: float = 0.0,
        weight: float = 1.0,
        name: str | None = None,
        on_error: str = "zero",
    ) -> None:
        """
        Args:
            language: target language code (one of `LANGUAGE_SCRIPTS`).
            think_only: score the ``<think>`` block when there is one (True) or always the whole response.
            empty_score: the score of a chain of thought with no words at all.
        """
        if language not in LANGUAGE_SCRIPTS:
            raise ValueError(f"language {language!r} is not supported; choose one of {sorted(LANGUAGE_SCRIPTS)}")
        super().__init__(weight=weight, name=name or "language_consistency", on_error=on_error)
        self.language = language
        self.scripts = LANGUAGE_SCRIPTS[language]
        self.think_only = think_only
        self.empty_score = empty_score

    def score(self, rollout: Rollout) -> Tensor:
        texts = response_texts(rollout, type(self).__name__)
        scores = [
            language_share(chain_of_thought(t) if self.think_only else t, self.scripts, self.empty_score) for t in texts
        ]
        return torch.tensor(scores, dtype=torch.float32, device=rollout.response_ids.device)


__all__ = ["LANGUAGE_SCRIPTS", "LanguageConsistencyReward", "chain_of_thought", "language_share", "script_words"]
