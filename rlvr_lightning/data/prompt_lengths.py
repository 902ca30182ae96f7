"""Reject prompts longer than the model's context when a run starts, naming where they come from.

`RLVRDataModule.setup` calls `check_prompt_lengths(task, module)` before any batch is built. It
needs a policy that says how it renders and tokenises prompts and how long its context is
(`render_prompt`, `encode_prompts`, `max_context`, as `HFPolicy` does); other policies, and
endless prompt streams, are not checked.

A prompt fits when its tokens plus the module's ``sampling.max_new_tokens`` fit in the context
(the check `HFPolicy.sample` makes per batch). Tokenising a whole dataset would cost seconds, so
only prompts that might not fit are tokenised: a byte-level BPE or SentencePiece token covers at
least one byte of the rendered text, so a prompt of ``b`` UTF-8 bytes has at most ``b`` tokens,
plus the few special tokens a tokenizer adds (``SPECIAL_TOKENS_MARGIN``).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset

SPECIAL_TOKENS_MARGIN = 16
CHUNK = 256  # prompts tokenised per call


def prompt_token_budget(module: Any) -> tuple[Any, int, int] | None:
    """(policy, tokens a prompt may have, the context), or None when the policy cannot say."""
    policy = getattr(module, "policy", None)
    context = getattr(policy, "max_context", None)
    if (
        not context
        or not callable(getattr(policy, "render_prompt", None))
        or not callable(getattr(policy, "encode_prompts", None))
    ):
        return None
    max_new_tokens = int(getattr(getattr(module, "sampling", None), "max_new_tokens", 0) or 0)
    return policy, int(context) - max_new_tokens, int(context)


def check_prompt_lengths(task: Any, module: Any) -> int:
    """Raise ValueError at the first prompt of the task's finite datasets that does not fit.

    Returns how many prompts were tokenised."""
    budget = prompt_token_budget(module)
    if budget is None:
        return 0
    policy, max_tokens, context = budget
    tokenised = 0
    for split, dataset in (("train", task.train_dataset()), ("val", task.val_dataset())):
        if dataset is None or isinstance(dataset, IterableDataset):
            continue
        suspects = []
        for i in range(len(dataset)):
            prompt = dataset[i]["prompt"]
            if (
                not isinstance(prompt, str)
                or len(policy.render_prompt(prompt).encode()) + SPECIAL_TOKENS_MARGIN > max_tokens
            ):
                suspects.append(i)
        for start in range(0, len(suspects), CHUNK):
            chunk = suspects[start : start + CHUNK]
            ids, _ = policy.encode_prompts([dataset[i]["prompt"] for i in chunk])
            tokenised += len(chunk)
            for i, row in zip(chunk, ids, strict=True):
                if len(row) > max_tokens:
                    raise ValueError(
                        f"{task.example_location(split, i)}: the prompt is {len(row):,} tokens long; "
                        f"the model's context is {context:,} tokens and "
                        f"sampling.max_new_tokens={context - max_tokens:,} leaves room for {max_tokens:,}. "
                        "Shorten or drop it (JSONLTask's max_prompt_chars rejects long prompts at load time)."
                    )
    return tokenised


__all__ = ["check_prompt_lengths", "prompt_token_budget"]
