"""`JudgePrompt`: the text a judge or reward model reads for one row, from a template.

``{response}`` is the response text, ``{prompt}`` the prompt as the policy saw it (its template
included), any other ``{field}`` the row's ``metadata[field]``. Only plain names are allowed (no
``{a.b}`` or ``{a[0]}``), and only the template is a format string: the values are inserted as they are.

Model output is untrusted. The scoring model's special tokens (``<|im_end|>``, ``<|endoftext|>``, ...)
spelled out in an untrusted value are removed before it is inserted, so a response cannot close the
judge's turn and write a verdict of its own; the tokenizer would otherwise read them as the real tokens.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Any

from rlvr_lightning.rollout import Rollout


def template_fields(template: str) -> list[str]:
    """The ``{field}`` names of a template, checked to be plain names and to include ``response``."""
    fields = []
    for _, field, format_spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if not field.isidentifier() or format_spec or conversion:
            raise ValueError(f"template field {{{field}}} must be a plain name such as {{response}} or {{answer}}")
        fields.append(field)
    if "response" not in fields:
        raise ValueError(f"the template must contain {{response}}, got {template!r}")
    return fields


def special_token_strings(tokenizer: Any) -> list[str]:
    """Every special token a tokenizer reads as one token, longest first (so none is cut in two)."""
    if tokenizer is None:
        return []
    tokens = set(getattr(tokenizer, "all_special_tokens", []))
    for added in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(added, "special", False):
            tokens.add(str(added))
    return sorted((t for t in tokens if t), key=len, reverse=True)


def remove_special_tokens(text: str, tokens: list[str]) -> str:
    """`text` without any of `tokens`, removed until none is left (``<|im_<|im_end|>end|>`` as well)."""
    while any(token in text for token in tokens):
        for token in tokens:
            text = text.replace(token, "")
    return text


class JudgePrompt:
    """Fills `template` for one row of a rollout (see the module docstring)."""

    def __init__(self, template: str, tokenizer: Any = None, untrusted: Iterable[str] | None = None) -> None:
        """
        Args:
            tokenizer: the scoring model's tokenizer, whose special tokens are removed from untrusted values.
            untrusted: the fields cleaned that way (None: every field; a reward model that reads the policy's
                own chat-formatted prompt cleans only ``response``).
        """
        self.template = template
        self.fields = template_fields(template)
        self.special_tokens = special_token_strings(tokenizer)
        self.untrusted = set(self.fields if untrusted is None else untrusted)

    def __call__(self, rollout: Rollout, i: int) -> str:
        if rollout.response_text is None:
            raise ValueError("a judged reward needs rollout.response_text (a language-model policy)")
        values = {}
        for field in self.fields:
            if field == "response":
                value = rollout.response_text[i]
            elif field == "prompt":
                value = rollout.prompt_text[i] if rollout.prompt_text is not None else ""
            else:
                metadata = rollout.metadata[i] if rollout.metadata else {}
                if field not in metadata:
                    raise KeyError(
                        f"template field {{{field}}}: row {i} has no metadata key {field!r} (keys: {sorted(metadata)})"
                    )
                value = metadata[field]
            value = str(value)
            values[field] = remove_special_tokens(value, self.special_tokens) if field in self.untrusted else value
        return self.template.format(**values)


__all__ = ["JudgePrompt", "remove_special_tokens", "special_token_strings", "template_fields"]
