"""The sampling parameters of one vLLM request, shared by the colocated engine (`vllm.SamplingParams(**...)`)
and the rollout servers (the same fields in the body of an OpenAI completions request), so that both sample
the same distribution with the same seed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr_lightning.generation.sampling_config import SamplingConfig


def sampling_request(
    sampling: SamplingConfig, n: int, max_tokens: int, seed: int, eos_token_ids: Sequence[int]
) -> dict[str, Any]:
    """vLLM's sampling parameters for `n` responses of at most `max_tokens` tokens to one prompt."""
    return {
        "n": n,
        "temperature": sampling.temperature if sampling.do_sample else 0.0,
        "top_p": sampling.top_p if sampling.do_sample else 1.0,
        "top_k": sampling.top_k if sampling.do_sample and sampling.top_k > 0 else 0,
        "min_p": sampling.min_p if sampling.do_sample else 0.0,
        "max_tokens": max_tokens,
        "min_tokens": sampling.min_new_tokens,
        "stop": list(sampling.stop_strings) or None,
        "stop_token_ids": list(eos_token_ids),  # the policy's EOS set, and only it:
        "ignore_eos": True,  # vLLM's own idea of EOS (tokenizer/config) would add to it
        "include_stop_str_in_output": True,
        "logprobs": 0,  # the chosen token's log-prob
        "seed": seed,
    }
