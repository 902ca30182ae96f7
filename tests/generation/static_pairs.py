"""Our eager loop and static decoding run on the same model, prompts and random stream, and their outputs compared.

The eager loop is run without compaction (`generate(compact=False)`: finished rows stay in the batch and draw their
uniform at every step), the random stream static decoding reproduces (`generation/static_generation.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr_lightning.generation.loop import generate, left_pad
from rlvr_lightning.generation.output import GenerationOutput, StopStringChecker
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.static_cache import WorkspacePool
from rlvr_lightning.generation.static_generation import static_generate

PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]  # uneven lengths: left padding
EOS = [2, 3, 4, 5]  # 1 token in 16: rows end at different steps


def tiny_model(model_type: str = "llama", vocab_size: int = 64, seed: int = 0):
    """A random tiny causal LM (Llama, or Qwen2 with biased q/k/v projections), 2 key/value heads for 4 heads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr_lightning.demos.tiny_lm import tiny_llama_config

    torch.manual_seed(seed)
    config = tiny_llama_config(vocab_size=vocab_size)
    config["model_type"] = model_type
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).eval()


def letters(rows: list[list[int]]) -> list[str]:
    """A stand-in tokenizer: token t decodes to "abcd"[t % 4], so the stop string "dd" ends about 1 row in 16 a step."""
    return ["".join("abcd"[t % 4] for t in row) for row in rows]


@dataclass
class Pair:
    eager: GenerationOutput
    static: GenerationOutput
    same_stream_after: bool  # the generator's state after both is the same


def run_pair(
    model,
    sampling: SamplingConfig,
    *,
    n: int = 4,
    prompts: list[list[int]] = PROMPTS,
    caps: list[int] | None = None,
    stop_strings: tuple[str, ...] = (),
    sync_every: int = 5,
    mode: str = "none",
    pool: WorkspacePool | None = None,
    seed: int = 1,
    device: str = "cpu",
) -> Pair:
    ids, mask = left_pad(prompts, pad_id=0)
    ids, mask = ids.to(device), mask.to(device)
    stop = StopStringChecker(list(stop_strings), letters)
    torch.manual_seed(seed)
    with torch.no_grad():
        eager = generate(
            model,
            ids,
            mask,
            n,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_ids=EOS,
            pad_token_id=0,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            stop=stop,
            compact=False,
            do_sample=sampling.do_sample,
            min_new_tokens=sampling.min_new_tokens,
            max_new_tokens_per_prompt=caps,
        )
    after_eager = torch.rand(4, device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        static = static_generate(
            model,
            ids,
            mask,
            n,
            sampling,
            pool=pool or WorkspacePool(),
            mode=mode,
            sync_every=sync_every,
            stop=stop,
            eos_token_ids=EOS,
            pad_token_id=0,
            max_new_tokens_per_prompt=caps,
        )
    return Pair(eager, static, torch.equal(after_eager, torch.rand(4, device=device)))


def static_only(
    model,
    sampling: SamplingConfig,
    *,
    prompts: list[list[int]] = PROMPTS,
    n: int = 4,
    pool: WorkspacePool | None = None,
    mode: str = "none",
    sync_every: int = 8,
    device: str = "cpu",
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """Static decoding alone (no eager run beside it), without stop strings, EOS id 3."""
    ids, mask = left_pad(prompts, pad_id=0)
    with torch.no_grad():
        return static_generate(
            model,
            ids.to(device),
            mask.to(device),
            n,
            sampling,
            pool=pool or WorkspacePool(),
            mode=mode,
            sync_every=sync_every,
            stop=StopStringChecker([], lambda rows: []),
            eos_token_ids=[3],
            pad_token_id=0,
            generator=generator,
        )


def assert_same(pair: Pair, log_prob_tolerance: float = 1e-5) -> None:
    """Tokens, masks, ends and steps identical; log-probs within the tolerance; the same stream afterwards."""
    eager, static = pair.eager, pair.static
    assert torch.equal(eager.response_ids, static.response_ids), (eager.response_ids, static.response_ids)
    assert torch.equal(eager.response_mask, static.response_mask)
    assert torch.equal(eager.truncated, static.truncated)
    assert torch.equal(eager.stopped_by_string, static.stopped_by_string)
    assert eager.steps == static.steps
    assert (eager.log_probs - static.log_probs).abs().max().item() <= log_prob_tolerance
    assert pair.same_stream_after


def static_decoding_unsupported() -> str | None:
    """Why this transformers cannot decode statically (`StaticCacheGeneration` refuses), or None."""
    from rlvr_lightning.generation.static_cache import static_length_on_host

    return static_length_on_host()
