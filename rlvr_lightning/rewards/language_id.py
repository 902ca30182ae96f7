"""Telling languages of one script apart (English from French) with a language identifier from PyPI.

`LangidDetector` uses `py3langid` (a fork of langid.py, Lui & Baldwin 2012: a naive Bayes classifier
over byte n-grams, 97 languages; its model ships inside the wheel, so nothing is downloaded at run
time; needs only numpy). Install it with ``pip install 'rlvr-lightning[language]'``.

A language identifier judges text, not single words, so the share of target-language words is
counted sentence by sentence:

1. the text (LaTeX commands and think/answer tags removed) is split into sentences at ``. ! ? ; :``
   followed by white space, at ``。！？；`` and at line breaks;
2. words in a script the target language does not use (Chinese in an English chain of thought)
   are never the target language and are not shown to the identifier;
3. consecutive sentences are merged until a chunk has at least `min_words` words in the target's
   scripts (a two-word sentence is too short to identify; a short remainder joins the chunk before);
4. each chunk is identified (the most likely language among `languages`, or among all the model
   knows); its words count as target-language words when that is the target.

The share is (target-language words) / (all words), words as in `rewards.language_scripts`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from rlvr_lightning.rewards.language_scripts import LANGUAGE_SCRIPTS, char_script, script_words, strip_markup

INSTALL_HINT = "pip install 'rlvr-lightning[language]'  (or: pip install py3langid)"
_SENTENCE_BREAK = re.compile(r"(?<=[.!?;:])\s+|(?<=[。！？；])|\n+")


@dataclass
class Chunk:
    """Text shown to the identifier and how many target-script words it holds."""

    text: str
    words: int


def split_for_identification(text: str, scripts: frozenset[str], min_words: int) -> tuple[list[Chunk], int]:
    """Chunks of target-script text (steps 1-3 of the module docstring) and the number of other-script words."""
    chunks: list[Chunk] = []
    other_words = 0
    pending: Chunk | None = None
    for sentence in _SENTENCE_BREAK.split(strip_markup(text)):
        words = script_words(sentence)
        own = sum(1 for script in words if script in scripts)
        other_words += len(words) - own
        if own == 0:
            continue
        # letters of other scripts become spaces: the identifier sees only the target-script part
        kept = "".join(" " if (s := char_script(c)) is not None and s not in scripts else c for c in sentence)
        pending = Chunk(kept, own) if pending is None else Chunk(f"{pending.text} {kept}", pending.words + own)
        if pending.words >= min_words:
            chunks.append(pending)
            pending = None
    if pending is not None:
        if chunks:
            last = chunks[-1]
            chunks[-1] = Chunk(f"{last.text} {pending.text}", last.words + pending.words)
        else:
            chunks.append(pending)
    return chunks, other_words


@functools.lru_cache(maxsize=8)
def _identifier(languages: tuple[str, ...] | None):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    if languages is not None:
        unknown = sorted(set(languages) - set(identifier.labels))
        if unknown:
            raise ValueError(f"py3langid does not know the language(s) {unknown}; it knows {sorted(identifier.labels)}")
        identifier.set_languages(list(languages))
    return identifier


class LangidDetector:
    """Share of the words of a text written in a target language, by py3langid (module docstring)."""

    name = "py3langid"

    def __init__(self, language: str, languages: list[str] | None = None, min_words: int = 5) -> None:
        if language not in LANGUAGE_SCRIPTS:
            raise ValueError(f"language {language!r} is not supported; choose one of {sorted(LANGUAGE_SCRIPTS)}")
        if languages is not None and language not in languages:
            raise ValueError(f"languages={languages} must include the target language {language!r}")
        if min_words < 1:
            raise ValueError(f"min_words must be >= 1, got {min_words}")
        if not langid_available():
            raise ImportError(f"the py3langid language identifier is not installed: {INSTALL_HINT}")
        self.language = language
        self.scripts = LANGUAGE_SCRIPTS[language]
        self.min_words = min_words
        self.identifier = _identifier(tuple(languages) if languages is not None else None)

    def identify(self, text: str) -> str:
        return self.identifier.classify(text)[0]

    def share(self, text: str, empty_score: float = 0.0) -> float:
        chunks, other_words = split_for_identification(text, self.scripts, self.min_words)
        total = other_words + sum(chunk.words for chunk in chunks)
        if total == 0:
            return empty_score
        return sum(chunk.words for chunk in chunks if self.identify(chunk.text) == self.language) / total


def langid_available() -> bool:
    try:
        import py3langid.langid  # noqa: F401
    except ImportError:
        return False
    return True


__all__ = ["Chunk", "INSTALL_HINT", "LangidDetector", "langid_available", "split_for_identification"]
