"""One step of static decoding: the function a CUDA graph or `torch.compile(fullgraph=True)` holds.

Everything a step reads or writes lives in a `DecodeWorkspace` (`static_cache.py`) and is updated in place; the
step has no shape that changes, no Python value that depends on the device and no host read. It computes what
a step of our eager loop (`loop.py`, `token_sampling.sample_next_token`) computes for every row, with the same
operations in the same order:

* the forward of the token each row feeds (`alive` rows their last token, finished rows pad, as the eager loop
  fed finished rows it kept in the batch), over the whole static cache under the 4D mask;
* `softmax(logits / temperature)`, EOS excluded before `min_new_tokens` (a device comparison with the step),
  top-k/top-p, the token whose CDF interval holds the row's uniform draw (drawn outside the step, in the eager
  loop's order and shape: `StaticCacheGeneration`), or the argmax when greedy;
* the log-prob of the token under the unfiltered distribution;
* the rows that end (EOS, their cap) on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.static_cache import DecodeWorkspace
from rlvr_lightning.generation.token_sampling import categorical_from_uniform, filter_logits


@dataclass(frozen=True)
class StepOptions:
    """The sampling options a step is built for (constants of its graph: another value is another graph)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    do_sample: bool = True
    suppress_eos: bool = False  # min_new_tokens > 0 and the tokenizer has EOS ids
    pad_token_id: int = 0
    min_p: float = 0.0

    @property
    def filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


def next_tokens(logits: Tensor, ws: DecodeWorkspace, options: StepOptions) -> tuple[Tensor, Tensor]:
    """`(tokens long[rows], log_probs float[rows])` for the workspace's step from `logits [rows, V]`, as the eager
    loop's `sample_next_token` (whose Python branches on the step become device selections here)."""
    scaled = logits.float()
    if options.temperature != 1.0:
        scaled = scaled / options.temperature
    choose_from, early = scaled, None
    if options.suppress_eos:
        early = ws.step < ws.min_new_tokens  # bool[1]: the eager loop excluded EOS at this step
        # EOS columns as a pointwise mask (no scatter into a copy of the logits): one fused pass with the softmax
        eos_columns = (torch.arange(scaled.shape[-1], device=scaled.device).unsqueeze(-1) == ws.eos).any(-1)
        choose_from = scaled.masked_fill(early & eos_columns, float("-inf"))
    if options.do_sample:
        filtered = filter_logits(choose_from, top_k=options.top_k, top_p=options.top_p, min_p=options.min_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = categorical_from_uniform(probs, ws.uniform)
        if not options.filters:  # the eager loop reads the log-prob off `probs` when it sampled the unfiltered ones
            from_probs = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log()
            if early is None:
                return tokens, from_probs
    else:
        tokens = choose_from.argmax(dim=-1)
    log_probs = scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    if options.do_sample and not options.filters:
        log_probs = torch.where(early, log_probs, from_probs)
    return tokens, log_probs


def record_step(ws: DecodeWorkspace, tokens: Tensor, log_probs: Tensor, pad_token_id: int) -> None:
    """Write the step's tokens and log-probs, end rows by EOS or their cap, set the tokens fed next, advance."""
    step = ws.step
    ws.tokens.index_copy_(1, step, tokens.unsqueeze(-1))
    ws.log_probs.index_copy_(1, step, log_probs.unsqueeze(-1))
    ended = torch.isin(tokens, ws.eos) | (ws.caps <= step + 1)
    ws.alive.logical_and_(~ended)
    ws.token.copy_(torch.where(ws.alive, tokens, pad_token_id))
    ws.step.add_(1)


def sample_step(ws: DecodeWorkspace, logits: Tensor, options: StepOptions) -> None:
    """Step 0 (from the prefill's logits) and the second half of every later step."""
    tokens, log_probs = next_tokens(logits, ws, options)
    record_step(ws, tokens, log_probs, options.pad_token_id)


def decode_step(ws: DecodeWorkspace, model: nn.Module, options: StepOptions) -> None:
    """A step after the first: the forward of the fed tokens at the next cache slot, then `sample_step`."""
    ws.mask.index_fill_(-1, ws.slot, True)
    out = model(
        input_ids=ws.token.unsqueeze(-1),
        attention_mask=ws.mask,
        position_ids=ws.positions.unsqueeze(-1),
        use_cache=True,
        **ws.cache_kwargs,
    )
    ws.positions.add_(1)
    ws.slot.add_(1)
    sample_step(ws, out.logits[:, -1, :], options)
