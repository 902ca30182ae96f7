"""Prompts to token ids for `HFPolicy`: `prompt.template` renders a prompt as text (the options are
described in `policies/hf_options.py`), the tokenizer encodes it; a prompt given as token ids is used as is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def check_prompt_template(prompt_template: str, system_prompt: str | None) -> None:
    """Raise ValueError unless the template is known and has a place for `system_prompt`, if one is set."""
    if prompt_template not in ("chat", "raw") and "{prompt}" not in prompt_template:
        raise ValueError(f"prompt.template must be 'chat', 'raw' or contain '{{prompt}}', got {prompt_template!r}")
    if system_prompt is not None and (
        prompt_template == "raw" or (prompt_template != "chat" and "{system}" not in prompt_template)
    ):
        raise ValueError("prompt.system_prompt needs prompt.template='chat' or a template containing '{system}'")


def render_prompt(tokenizer: Any, prompt: Any, prompt_template: str, system_prompt: str | None) -> str:
    """The text the model sees for one prompt of a batch."""
    if prompt_template == "chat":
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, Sequence) and all(isinstance(m, dict) for m in prompt):
            messages = [dict(m) for m in prompt]
        else:
            raise TypeError(f"a chat prompt is a string or a list of message dicts, got {type(prompt).__name__}")
        if system_prompt is not None and (not messages or messages[0].get("role") != "system"):
            messages.insert(0, {"role": "system", "content": system_prompt})
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "prompt.template='chat' but the tokenizer has no chat template; "
                "use prompt.template='raw' or a template string containing '{prompt}'"
            )
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(prompt, str):
        raise TypeError(f"prompt.template={prompt_template!r} needs string prompts, got {type(prompt).__name__}")
    if prompt_template == "raw":
        return prompt
    text = prompt_template.replace("{prompt}", prompt)
    if "{system}" in text:
        text = text.replace("{system}", system_prompt or "")
    return text


def encode_prompts(
    tokenizer: Any, prompts: Sequence[Any], render: Callable[[Any], str], add_special_tokens: bool
) -> tuple[list[list[int]], list[str]]:
    """Token ids and rendered text of each prompt; `render` gives the text of a prompt that is not token ids,
    `add_special_tokens` whether the tokenizer adds its own (BOS, ...) to it."""
    ids: list[list[int] | None] = [None] * len(prompts)
    texts: list[str | None] = [None] * len(prompts)
    to_encode: list[int] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
            ids[i] = list(prompt)
            texts[i] = tokenizer.decode(ids[i])
        else:
            texts[i] = render(prompt)
            to_encode.append(i)
    if to_encode:
        encoded = tokenizer([texts[i] for i in to_encode], add_special_tokens=add_special_tokens)["input_ids"]
        for i, row in zip(to_encode, encoded, strict=True):
            ids[i] = list(row)
    for i, row in enumerate(ids):
        if not row:
            raise ValueError(f"prompt {i} of the batch is empty after tokenization")
    return ids, texts  # type: ignore[return-value]
