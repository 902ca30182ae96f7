"""Which sampled tokens can complete a stop string, so that the per-step check decodes only their rows.

The check (`RowEnds`, `StopStringChecker`) decodes every unfinished row's last tokens at every step: 2 ms a
step for 128 rows of SmolLM2 on a CPU core, as long as a GPU's whole decoding step. For a tokenizer whose decoder
is byte-level (GPT-2-style BPE: SmolLM2, Qwen, Llama 3) and that does not clean up spaces, a row's text is its
tokens' bytes decoded as UTF-8, and a row still decoding held no stop string at its previous step; so a stop
string found now ends with a byte of the new token, and that byte is the stop string's last. A token that holds
no stop string's last byte cannot end its row, and the row is not decoded at this step: the rows that end, and
the steps they end at, are the same. Added tokens (decoded as their text) and rows of other tokenizers are always
checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """The byte each character of a byte-level BPE vocabulary stands for (GPT-2's `bytes_to_unicode`, inverted:
    printable bytes are themselves, the others shifted to 256 and up)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in characters:
            characters[byte] = chr(256 + shifted)
            shifted += 1
    return {character: byte for byte, character in characters.items()}


def stop_string_end_filter(tokenizer: Any, stop_strings: Sequence[str]) -> Callable[[int], bool] | None:
    """`may_end(token_id)`: False only for a token that cannot complete any of `stop_strings` (see the module's
    docstring); None where the tokenizer is not byte-level or cleans up spaces (every row is checked)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if (
        not stop_strings
        or type(decoder).__name__ != "ByteLevel"
        or getattr(tokenizer, "clean_up_tokenization_spaces", True)
    ):
        return None
    last_bytes = {s.encode()[-1] for s in stop_strings if s}
    added = set(getattr(tokenizer, "added_tokens_decoder", {}))
    alphabet = byte_level_alphabet()
    known: dict[int, bool] = {}

    def may_end(token_id: int) -> bool:
        answer = known.get(token_id)
        if answer is None:
            piece = backend.id_to_token(token_id)
            if token_id in added or piece is None or any(c not in alphabet for c in piece):
                answer = True
            else:
                answer = any(alphabet[c] in last_bytes for c in piece)
            known[token_id] = answer
        return answer

    return may_end
