"""Words and their Unicode scripts: the dependency-free language judge (and the word count of every judge).

A word is a maximal run of letters of one script; CJK ideographs, kana and Thai characters count
one word each (those scripts do not separate words by spaces); digits, symbols, LaTeX commands
(``\\frac``) and the ``<think>``/``<answer>`` tags count as nothing. A word's script is the first
word of its characters' Unicode names (``LATIN``, ``CJK``, ``CYRILLIC``, ...).

Judged by script alone, English and French are one language: `language_share` tells English from
Chinese, Russian or Arabic, not from French. `rewards.language_id` tells languages of one script apart.
"""

from __future__ import annotations

import re
import unicodedata

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


def char_script(char: str) -> str | None:
    """The script of a letter (None for anything that is not a letter)."""
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    if not name:
        return None
    script = name.split(" ", 1)[0]
    if script == "FULLWIDTH":  # Ａ is Latin
        return "LATIN" if "LATIN" in name else None
    return script


def strip_markup(text: str) -> str:
    """`text` without LaTeX commands and think/answer tags (they are not words of any language)."""
    return _FORMAT_TAG.sub(" ", _LATEX_COMMAND.sub(" ", text))


def script_words(text: str) -> list[str]:
    """The script of every word of `text` (see the module docstring for what a word is)."""
    words: list[str] = []
    current: str | None = None
    for char in strip_markup(text):
        script = char_script(char)
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


def language_share(text: str, scripts: frozenset[str], empty_score: float = 0.0) -> float:
    """(words in `scripts`) / (all words) of `text`; `empty_score` when it has no words."""
    words = script_words(text)
    if not words:
        return empty_score
    return sum(1 for w in words if w in scripts) / len(words)


__all__ = ["LANGUAGE_SCRIPTS", "char_script", "language_share", "script_words", "strip_markup"]
