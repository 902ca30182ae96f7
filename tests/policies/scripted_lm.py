"""A tiny Llama whose weights follow a script: greedy decoding continues each scripted token with the next one.

`script_weights(policy, texts, strength)` adds to the LM head, for every scripted transition
(previous token -> next token), a row that reads the previous token's embedding: the logit of the
scripted next token rises by about `strength`. The rest of the network stays random, so logits still
depend on the whole context (attention), only slightly. It lives in the weights, so a vLLM engine fed
those weights follows the same script. Tool tags are added tokens, so transitions are unambiguous.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import torch

from rlvr_lightning.demos.tiny_lm import build_tiny_tokenizer

TAGS = ["<calculator>", "</calculator>", "<result>", "</result>", "<think>", "</think>"]


def save_tool_tokenizer(directory: str | Path) -> Path:
    """The tiny tokenizer with the tool and thinking tags as added (not special) tokens."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(TAGS)
    directory = Path(directory)
    tokenizer.save_pretrained(str(directory))
    return directory


def transitions(tokenizer, sequences: list[list[str | int]]) -> dict[int, int]:
    """(previous token -> next token) along each sequence of text pieces and token ids; conflicts fail."""
    table: dict[int, int] = {}
    for pieces in sequences:
        ids: list[int] = []
        for piece in pieces:
            ids += [piece] if isinstance(piece, int) else tokenizer(piece, add_special_tokens=False)["input_ids"]
        for prev, nxt in pairwise(ids):
            if table.get(prev, nxt) != nxt:
                raise ValueError(f"script conflict after token {prev} ({tokenizer.decode([prev])!r})")
            table[prev] = nxt
    return table


@torch.no_grad()
def script_weights(policy, table: dict[int, int], strength: float = 6.0) -> None:
    embeddings = policy.base_model.get_input_embeddings().weight
    head = policy.base_model.get_output_embeddings().weight
    hidden = embeddings.shape[1]
    for prev, nxt in table.items():
        direction = embeddings[prev] / embeddings[prev].norm()
        head[nxt] += strength * direction / hidden**0.5  # the final RMSNorm scales the hidden state to ~sqrt(hidden)
