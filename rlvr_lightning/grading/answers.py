"""Answer extraction and string normalisation for verifiable math rewards.

Everything here is a pure string function of *untrusted* model output, so every
function runs in time linear in its input: brace matching is a single depth scan
(no recursive regex), searches use ``rfind`` or regexes without nested
quantifiers, and nothing is ever ``eval``'d.

Policy decisions (documented once, tested in ``tests/grading/test_answers.py``):

* The LAST answer wins (last ``\\boxed``, last ``<answer>``, last ``####``, last
  "the answer is"), as in the usual GRPO/R1 reward functions.
* ``normalize_answer`` is a conservative *string* canonicalisation used as a fast
  path and as the fallback when math-verify cannot parse. Semantic equivalence
  (``1/2`` vs ``0.5``) is decided by :mod:`rlvr_lightning.grading.math_equivalence`.
* Units: a plain number followed only by unit words (``5 cm``, ``\\text{5 apples}``,
  ``$12 dollars``) is reduced to the number, so it matches a unitless gold. Units are
  therefore not compared (``5 cm`` also matches ``5 m``... only if ``m`` were stripped:
  single-letter units are deliberately NOT stripped, since ``2 x`` is algebra).
  Words that are math (``pi``, ``sqrt``, ``sin``, ...) are never stripped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from decimal import Decimal

__all__ = [
    "DEFAULT_METHODS",
    "clean_answer",
    "extract_answer",
    "extract_answer_is",
    "extract_boxed",
    "extract_last_number",
    "extract_gsm8k",
    "extract_tagged",
    "majority_vote",
    "normalize_answer",
]

DEFAULT_METHODS: tuple[str, ...] = ("boxed", "answer_tag", "gsm8k", "answer_is")

_BOX_MACROS = ("\\boxed", "\\fbox")


# --------------------------------------------------------------------------- extraction


def _match_brace(text: str, open_idx: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_idx``, or -1 if unbalanced.

    Linear depth scan. A backslash escapes the next character, so ``\\{``/``\\}``
    (literal braces, e.g. sets) do not change the depth.
    """
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def extract_boxed(text: str | None) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``).

    Nested braces are handled by a depth scan; an unbalanced last box gives None.
    """
    if not text:
        return None
    # Last macro occurrence; a longer name that merely starts with "\boxed" (e.g. a
    # hypothetical "\boxedx") is skipped by walking back with rfind.
    start = -1
    macro_len = 0
    for macro in _BOX_MACROS:
        end = len(text)
        while True:
            i = text.rfind(macro, 0, end)
            if i < 0:
                break
            j = i + len(macro)
            if j < len(text) and text[j].isalpha():
                end = i  # e.g. "\boxedfoo": not our macro, keep looking left
                continue
            if i > start:
                start, macro_len = i, len(macro)
            break
    if start < 0:
        return None
    j = start + macro_len
    n = len(text)
    while j < n and text[j] in " \t":
        j += 1
    if j >= n:
        return None
    if text[j] == "{":
        close = _match_brace(text, j)
        if close < 0:
            return None
        return text[j + 1 : close].strip()
    if j == start + macro_len:
        return None  # "\boxed5" without a space or brace is not valid LaTeX
    # "\boxed 5": a single token, up to whitespace or the end of math mode.
    k = j
    while k < n and not text[k].isspace() and text[k] not in "$":
        k += 1
    token = text[j:k].strip()
    return token or None


def extract_tagged(text: str | None, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` (case-insensitive tag name), stripped."""
    if not text:
        return None
    t = re.escape(tag)
    closes = list(re.finditer(rf"</\s*{t}\s*>", text, flags=re.IGNORECASE))
    if not closes:
        return None
    close = closes[-1]
    last_open = None
    for m in re.finditer(rf"<\s*{t}(?:\s[^<>]*)?>", text[: close.start()], flags=re.IGNORECASE):
        last_open = m
    if last_open is None:
        return None
    return text[last_open.end() : close.start()].strip()


# "#### 1,234" is the GSM8K gold format (openai/grade-school-math, dataset README): the final
# answer is the number after the last "####", "," separating thousands. Kept whole: a sign,
# thousands groups ("1,234" or "1 234"), decimals, an exponent ("1e3") and a denominator ("1/2").
# Alternatives are tried in order and nothing is nested: linear time.
_GSM8K_NUMBER = re.compile(
    r"[ \t]*\$?[ \t]*(?P<sign>[-+\u2212]?)[ \t]*\$?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?![\d,])|\d{1,3}(?: \d{3})+(?!\d)|\d+)?"
    r"(?P<frac>\.\d+)?(?P<exp>[eE][-+]?\d+)?(?:/(?P<den>\d+))?"
)
_GSM8K_EXAMPLES = "72, -5, 1,234, 1 234, 3.5, .5, 1/2, 1e3 or 1.8e-2"


def extract_gsm8k(text: str | None, strict: bool = False) -> str | None:
    """The number after the last ``####`` (GSM8K gold format), thousands separators removed.

    ``#### 1,234`` -> ``1234``, ``#### 1/2`` -> ``1/2``, ``#### 1e3`` -> ``1e3``. ``strict`` (for gold
    answers): the rest of the line must be that number and nothing else (a trailing period aside),
    else ``ValueError`` says what is there, so ``#### 3,14`` fails instead of becoming ``3``.
    """
    if not text:
        return None
    i = text.rfind("####")
    if i < 0:
        return None
    m = _GSM8K_NUMBER.match(text, i + 4)
    if m.group("int") is None and m.group("frac") is None:
        if strict:
            raise ValueError(f"the final answer after '####' is not a number: {_rest_of_line(text, i + 4)!r}")
        return None
    if strict:
        rest = _rest_of_line(text, m.end())
        if rest not in ("", "."):
            raise ValueError(
                f"cannot parse the final answer after '####': {_rest_of_line(text, i + 4)!r} "
                f"(expected a number such as {_GSM8K_EXAMPLES})"
            )
    sign = "-" if m.group("sign") in ("-", "\u2212") else ""
    number = (m.group("int") or "").replace(",", "").replace(" ", "") + (m.group("frac") or "") + (m.group("exp") or "")
    if m.group("den") is not None:
        number += "/" + m.group("den")
    return sign + number


def _rest_of_line(text: str, start: int, max_chars: int = 80) -> str:
    end = text.find("\n", start)
    return text[start : end if end >= 0 else len(text)].strip()[:max_chars]


_ANSWER_IS = re.compile(r"answer\s{0,10}(?:is\b|:)\s{0,10}:?", re.IGNORECASE)


def extract_answer_is(text: str | None) -> str | None:
    """X from the last "the answer is X" / "The final answer is X" / "Answer: X".

    X runs to the end of the line or to a sentence-ending period; a trailing period,
    surrounding ``$``/``**`` and a ``\\boxed{}`` wrapper are removed.
    """
    if not text:
        return None
    last = None
    for m in _ANSWER_IS.finditer(text):
        last = m
    if last is None:
        return None
    start = last.end()
    nl = text.find("\n", start)
    line = text[start : nl if nl >= 0 else len(text)]
    # Cut at a sentence end (". " or ".$ "), not at a decimal point.
    m = re.search(r"\.(?=\s|$)", line)
    if m is not None:
        line = line[: m.start()]
    ans = line.strip().strip("*").strip()
    boxed = extract_boxed(ans)
    if boxed is not None:
        ans = boxed
    ans = ans.strip()
    if ans.startswith("\\$"):
        ans = ans[2:]
    ans = ans.strip("$").strip().rstrip(".").strip()
    return ans or None


# A number: digits with optional thousands groups and decimals. No nested quantifiers: linear.
_LAST_NUMBER = re.compile(r"[-−]?\d+(?:,\d{3})*(?:\.\d+)?")


def extract_last_number(text: str | None) -> str | None:
    """The last number in the text (``1,234`` -> ``1234``, ``-5``, ``3.5``), e.g. ``47 + 21 = 68`` -> ``68``.

    The usual last-resort extractor of GSM8K-style graders; not in ``DEFAULT_METHODS``.
    """
    if not text:
        return None
    last = None
    for m in _LAST_NUMBER.finditer(text):
        last = m
    if last is None:
        return None
    return last.group(0).replace(",", "").replace("−", "-")


_EXTRACTORS = {
    "boxed": extract_boxed,
    "answer_tag": extract_tagged,
    "gsm8k": extract_gsm8k,
    "answer_is": extract_answer_is,
    "last_number": extract_last_number,
}


def extract_answer(text: str | None, methods: Sequence[str] | Iterable[str] = DEFAULT_METHODS) -> str | None:
    """The result of the first method (in order) that finds an answer, else None.

    Methods: ``"boxed"``, ``"answer_tag"``, ``"gsm8k"``, ``"answer_is"``, ``"last_number"``.
    """
    if not text:
        return None
    for name in methods:
        try:
            fn = _EXTRACTORS[name]
        except KeyError:
            raise ValueError(f"unknown extraction method {name!r}; choose from {sorted(_EXTRACTORS)}") from None
        ans = fn(text)
        if ans:
            return ans
    return None


# --------------------------------------------------------------------------- normalisation

# Units stripped after a plain number. Multi-letter only: single letters (m, g, s)
# are too often variables. Source of the idea: the unit removal of Hendrycks et al.'s
# MATH `strip_string` (hendrycks/math, modeling/math_equivalence.py).
_UNIT_WORDS = frozenset(
    """
    dollar dollars cent cents usd euro euros eur pound pounds yen
    cm mm km m2 cm2 km2 meter meters metre metres kilometer kilometers kilometre kilometres
    centimeter centimeters millimeter millimeters inch inches in ft foot feet yard yards yd
    mile miles mi mph kph kmh kg mg gram grams kilogram kilograms lb lbs ounce ounces oz ton tons
    liter liters litre litres ml gallon gallons quart quarts cup cups
    sec secs second seconds min mins minute minutes hr hrs hour hours day days week weeks
    month months year years yr yrs
    degree degrees deg percent units unit square sq cubic per
    """.split()
)
# Words that must survive even after a number: they are mathematics, not units.
_MATH_WORDS = frozenset(
    """
    pi e i sqrt sin cos tan cot sec csc log ln exp arcsin arccos arctan sinh cosh tanh
    inf infty infinity mod pmod choose binom frac cdot times
    """.split()
)
_PLAIN_NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:/\d+)?"
_LEADING_NUMBER = re.compile(_PLAIN_NUMBER)
_WORDS_ONLY = re.compile(r"[A-Za-z.\s]+")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
# Thousands separators: a run of 1-3 digits followed by one or more ",ddd" groups.
_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+)(?![\d,])")
_LATEX_THOUSANDS = re.compile(r"(\d)(?:\\,|\{,\})(?=\d{3}(?!\d))")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree")
# A whole answer in scientific notation ("1.8e1", "-2.5E-3"); no nested quantifiers: linear.
_SCIENTIFIC = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d{1,3}")
_MAX_EXPONENT = 300  # "1e100000" would be a 100,001-character number: left as it is


def _expand_scientific(s: str) -> str:
    """``1.8e1`` -> ``18``, ``2.5e-1`` -> ``0.25`` (exact, via Decimal); anything else unchanged."""
    if _SCIENTIFIC.fullmatch(s) is None:
        return s
    value = Decimal(s)
    if abs(value.as_tuple().exponent) > _MAX_EXPONENT:
        return s
    return format(value, "f")


def _strip_unit_words(s: str) -> str:
    m = _LEADING_NUMBER.match(s)
    if m is None or m.end() == len(s):
        return s
    rest = s[m.end() :]
    if _WORDS_ONLY.fullmatch(rest) is None:  # single character class: linear time
        return s
    words = [w.lower() for w in rest.replace(".", " ").split()]
    if not words:
        return s
    if any(w in _MATH_WORDS for w in words):
        return s
    # Any multi-letter word after a number is treated as a unit / noun ("5 apples");
    # a single letter is only stripped if it is a known unit (none are, see above).
    if all(len(w) >= 2 or w in _UNIT_WORDS for w in words):
        return m.group(0)
    return s


def clean_answer(s: str | None) -> str:
    """Meaning-preserving clean-up applied before math-verify and by ``normalize_answer``.

    Steps (in order): strip; unwrap a whole ``\\boxed{}``; remove ``$``, ``\\$``,
    ``\\left``/``\\right``, thin spaces ``\\, \\! \\; \\:``, ``~``; ``\\dfrac``/``\\tfrac``
    -> ``\\frac``; ``^\\circ``/``°`` removed; unicode minus -> ``-``; ``\\%`` -> ``%``;
    ``\\text{...}``-style wrappers unwrapped; thousands separators removed only when the
    answer contains no brackets (so ``(1,000, 2)`` and ``(1,2)`` are left alone); a
    trailing period and a leading ``+`` removed; "number + unit words" -> number; a number
    in scientific notation written out (``1.8e1`` -> ``18``; math-verify reads ``e`` as Euler's).
    """
    if s is None:
        return ""
    s = s.strip()
    if not s:
        return ""
    for macro in _BOX_MACROS:  # unwrap a box spanning the whole answer
        if s.startswith(macro + "{"):
            close = _match_brace(s, len(macro))
            if close == len(s) - 1:
                s = s[len(macro) + 1 : close].strip()
            break
    s = s.replace("\\$", "").replace("$", "")
    s = _LATEX_THOUSANDS.sub(r"\1", s)  # "5\,000" / "5{,}000" -> "5000"
    # hendrycks/math strip_string: "\!" removal, dfrac/tfrac -> frac, \left/\right, degrees.
    for tok in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "~"):
        s = s.replace(tok, " " if tok in ("\\,", "\\;", "\\:", "~") else "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES.sub("", s)
    s = s.replace("\u2212", "-").replace("\u2013", "-")  # unicode minus / en dash
    s = s.replace("\\%", "%")
    s = _TEXT_MACRO.sub(lambda m: m.group(1), s)
    s = s.strip()
    if not any(c in s for c in "()[]{}"):
        s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), s)
    s = s.rstrip(".").strip()
    if s.startswith("+"):
        s = s[1:].lstrip()
    s = _strip_unit_words(s)
    return _expand_scientific(s.strip())


def normalize_answer(s: str | None) -> str:
    """Canonical string for exact-match comparison (the fallback of math-verify).

    ``clean_answer`` plus: lowercase, whitespace collapsed to single spaces and removed
    next to operators/brackets, and the space in ``- 3`` removed.
    """
    s = clean_answer(s)
    if not s:
        return ""
    s = " ".join(s.lower().split())
    s = re.sub(r"\s*([-+*/=^_(){}\[\],])\s*", r"\1", s)
    s = s.rstrip(".")
    return s


def majority_vote(answers: Sequence[str | None], weights: Sequence[float] | None = None) -> str | None:
    """The most common non-None answer, or with `weights` (one per answer) the one whose votes weigh most (RLCR's
    confidence-weighted vote, Damani et al. 2025); ties go to the one seen first; None if there is none."""
    counts: Counter = Counter()
    for i, answer in enumerate(answers):
        if answer is not None:
            counts[answer] += 1.0 if weights is None else float(weights[i])
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)
