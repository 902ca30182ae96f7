"""A model's size estimated from its options, refused before allocation when its weights alone exceed the memory
available (a config with `num_hidden_layers: 1000000` fails in a second, not after minutes of swapping).

The estimate counts the weights only; training needs about four times as much (gradients and Adam's two
moments), so a model refused here could never have trained, and one let through may still not fit.
"""

from __future__ import annotations

import os
from typing import Any

GIB = 1 << 30


class ModelTooLargeError(ValueError):
    """The weights a model's options describe would not fit in the memory available."""


def available_memory_bytes() -> int | None:
    """Memory this process could still allocate (MemAvailable; None when the system does not say)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_in_memory(option: str, what: str, num_parameters: float, bytes_per_parameter: int) -> None:
    """Raise `ModelTooLargeError` (its message starts with `option`) when `num_parameters` weights of
    `bytes_per_parameter` bytes exceed the available memory."""
    needed = num_parameters * bytes_per_parameter
    available = available_memory_bytes()
    if available is None or needed <= available:
        return
    raise ModelTooLargeError(
        f"{option}: {what} has about {num_parameters:.3g} parameters, whose weights alone need "
        f"{needed / GIB:,.1f} GiB; {available / GIB:,.1f} GiB of memory is available (training needs about 4x "
        "the weights: gradients and the optimizer's state)"
    )


def transformer_parameters(config: Any) -> float | None:
    """About how many parameters a decoder-only transformer of this Hugging Face config has (None when the config
    lacks the sizes): embeddings (twice unless tied), and per layer attention (4 H^2) and a gated MLP (3 H I)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", None)
    layers = getattr(text, "num_hidden_layers", None)
    vocab = getattr(text, "vocab_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, vocab)):
        return None
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    embeddings = vocab * hidden * (1 if getattr(config, "tie_word_embeddings", True) else 2)
    return float(embeddings + layers * (4 * hidden * hidden + 3 * hidden * intermediate))
