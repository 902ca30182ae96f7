"""Drawing one token per row from a step's logits: top-k, top-p and min-p filtering, a categorical draw by one uniform
per row, and the sampled token's log-prob under the unfiltered distribution at the sampling temperature (what the
trainer's `token_log_probs` recomputes). The eager loop (`loop.py`) calls `sample_next_token`; the static step
(`static_decode.py`) makes the same choices as device selections.
"""

from __future__ import annotations

import torch
from torch import Tensor


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> Tensor:
    """Top-k, then nucleus (top-p), then min-p filtering of `logits [B, V]` (transformers' order of its warpers):
    removed entries become -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # remove a token when the tokens ranked above it already cover top_p (the top one always stays)
        remove = (probs.cumsum(-1) - probs) > top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    if min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        # remove a token less likely than min_p times the likeliest one (Nguyen et al. 2024, arXiv:2407.01082;
        # transformers' MinPLogitsWarper): the likeliest always stays
        logits = logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return logits


def _sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row of `probs [B, V]` by inverting the CDF with one uniform per row.

    Same distribution as `torch.multinomial(probs, 1)`, whose CPU kernel draws an exponential
    variate per vocabulary entry (~10% of a SmolLM2 decoding step); this draws one number per row.
    """
    uniform = torch.rand((probs.shape[0], 1), device=probs.device, dtype=probs.dtype, generator=generator)
    return categorical_from_uniform(probs, uniform, ask_host=host_reads_are_free(probs.device))


def categorical_from_uniform(probs: Tensor, uniform: Tensor, ask_host: bool = False) -> Tensor:
    """The token of each row of `probs [B, V]` whose CDF interval holds `uniform [B, 1]` (in [0, 1)) times the
    row's total mass."""
    cdf = probs.cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
    # `u` rounding up to the total mass can land on a zero-probability tail token: take the mode then. Asking
    # whether a row needs it (`ask_host`) costs nothing on a CPU and saves a pass over the vocabulary; on an
    # accelerator the answer would wait for the queued work, so the mode is computed for every row instead.
    valid = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) > 0
    if ask_host and bool(valid.all()):
        return tokens
    return torch.where(valid, tokens, probs.argmax(dim=-1))


def host_reads_are_free(device: torch.device) -> bool:
    """Whether reading a value of `device` on the host costs no synchronisation (a CPU: nothing is queued)."""
    return device.type == "cpu"


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    do_sample: bool = True,
    suppress: Tensor | None = None,
    generator: torch.Generator | None = None,
    min_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Sample one token per row of `logits [B, V]` (the argmax when `do_sample` is False).

    `suppress` (token ids) are never chosen (e.g. EOS before `min_new_tokens`); draws come from `generator`
    (None: torch's global generator). Returns
    `(tokens long[B], log_probs float[B])`; the log-probs are under the unfiltered
    `softmax(logits / temperature)`, i.e. what `token_log_probs` recomputes for the same tokens.
    """
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    choose_from = scaled
    if suppress is not None and suppress.numel():
        choose_from = scaled.index_fill(-1, suppress, float("-inf"))
    if do_sample:
        filtered = filter_logits(choose_from, top_k=top_k, top_p=top_p, min_p=min_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = _sample_categorical(probs, generator)
        if filtered is scaled:  # nothing filtered: the sampling distribution is the unfiltered one
            return tokens, probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log()
    else:
        tokens = choose_from.argmax(dim=-1)
    log_probs = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return tokens, log_probs


__all__ = ["categorical_from_uniform", "filter_logits", "host_reads_are_free", "sample_next_token"]
