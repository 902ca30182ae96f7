"""Generation-side prompt sharing: each distinct prompt reaches the model once per group, not once per row.

Only public behaviour is used: `HFPolicy.sample`, the model it holds (`policy.model`, observed with a
forward pre-hook) and the `Rollout` it returns. The reference sampler below prefills every row on its
own with plain `model(...)` calls; under the same seed it must draw the very same tokens.
"""

from __future__ import annotations

import torch

from rlvr_lightning.generation.kv_cache import cache_argument, returned_cache
from rlvr_lightning.generation.sampling_config import SamplingConfig

PROMPTS = ["What is 2+3?", "The quick brown fox jumps over the lazy dog.", "ab"]  # different lengths: padding
GROUP = 4
NEW_TOKENS = 6
# EOS is suppressed for every step, so no row finishes early and every step draws one uniform per row
SAMPLING = SamplingConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, temperature=1.0)


def _batch():
    return {"prompt": list(PROMPTS), "metadata": [{} for _ in PROMPTS]}


def _count_fed_tokens(policy):
    """Records (tokens per row, real tokens) of every forward call of the model."""
    calls: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        mask = kwargs.get("attention_mask")
        width = ids.shape[1]
        real = int(mask[:, -width:].sum()) if mask is not None else ids.numel()
        calls.append((width, real))

    return calls, policy.model.register_forward_pre_hook(hook, with_kwargs=True)


def _prompt_lengths(rollout) -> list[int]:
    """Real tokens of each distinct prompt (one per group)."""
    first_rows = torch.arange(0, rollout.num_rows, rollout.group_size)
    return rollout.prompt_mask[first_rows].sum(-1).long().tolist()


def test_each_prompt_is_prefilled_once_per_group(make_policy):
    policy = make_policy()
    calls, handle = _count_fed_tokens(policy)
    try:
        torch.manual_seed(0)
        rollout = policy.sample(_batch(), GROUP, SAMPLING)
    finally:
        handle.remove()
    lengths = _prompt_lengths(rollout)
    prefill_tokens = sum(real for width, real in calls if width > 1)
    assert prefill_tokens == sum(lengths), (calls, lengths)  # prefilled per row it would be GROUP times that
    # the rest of the calls feed one sampled token per row and step
    decode = [(width, real) for width, real in calls if width == 1]
    assert sum(real for _, real in decode) == len(PROMPTS) * GROUP * (NEW_TOKENS - 1)


@torch.no_grad()
def _sample_rows_separately(model, rollout, eos_ids: list[int], seed: int) -> torch.Tensor:
    """Reference: every row prefills its own unpadded prompt; the same sampling rule, one uniform per row and step."""
    rows = []
    for r in range(rollout.num_rows):
        ids = rollout.prompt_ids[r][rollout.prompt_mask[r].bool()].unsqueeze(0)
        out = model(input_ids=ids, use_cache=True)
        rows.append([returned_cache(out), out.logits[0, -1]])
    torch.manual_seed(seed)
    sampled = []
    for step in range(NEW_TOKENS):
        logits = torch.stack([row[1] for row in rows]).float()
        logits[:, eos_ids] = float("-inf")  # EOS suppressed before min_new_tokens
        probs = torch.softmax(logits, dim=-1)
        # inverse-CDF draw: one uniform per row (the sampler's rule; same distribution as multinomial)
        cdf = probs.cumsum(-1)
        u = torch.rand((probs.shape[0], 1), dtype=cdf.dtype) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
        sampled.append(tokens)
        if step + 1 < NEW_TOKENS:
            for r, row in enumerate(rows):
                out = model(input_ids=tokens[r].view(1, 1), use_cache=True, **cache_argument(model, row[0]))
                row[0], row[1] = returned_cache(out), out.logits[0, -1]
    return torch.stack(sampled, dim=1)


def test_shared_prefill_samples_the_same_tokens_as_per_row_prefill(make_policy):
    policy = make_policy()
    torch.manual_seed(123)
    rollout = policy.sample(_batch(), GROUP, SAMPLING)
    model = policy.model
    model.eval()
    reference = _sample_rows_separately(model, rollout, sorted(policy.eos_token_ids), seed=123)
    assert rollout.response_ids.shape == (len(PROMPTS) * GROUP, NEW_TOKENS)
    assert torch.equal(rollout.response_ids, reference)
    # a group's rows are different samples of one prompt, not copies
    assert len({tuple(row) for row in rollout.response_ids[:GROUP].tolist()}) > 1
