"""Verifiable rewards: answer extraction, math equivalence and a code sandbox.

Pure-python (no Lightning, no torch). Model output is untrusted input: nothing here
evaluates it in-process; math checking runs in killable worker processes
(:class:`MathVerifier`) and code runs in an isolated child process
(:func:`run_python_tests`).
"""

from rlvr_lightning.grading.answers import (
    DEFAULT_METHODS,
    clean_answer,
    extract_answer,
    extract_answer_is,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    extract_tagged,
    majority_vote,
    normalize_answer,
)
from rlvr_lightning.grading.math_equivalence import MathVerifier, answers_match
from rlvr_lightning.grading.sandbox import (
    SandboxResult,
    SandboxUnavailable,
    extract_python_program,
    run_python_tests,
    sandbox_capabilities,
)

__all__ = [
    "DEFAULT_METHODS",
    "MathVerifier",
    "SandboxResult",
    "SandboxUnavailable",
    "answers_match",
    "clean_answer",
    "extract_answer",
    "extract_answer_is",
    "extract_boxed",
    "extract_gsm8k",
    "extract_last_number",
    "extract_tagged",
    "majority_vote",
    "extract_python_program",
    "normalize_answer",
    "run_python_tests",
    "sandbox_capabilities",
]
