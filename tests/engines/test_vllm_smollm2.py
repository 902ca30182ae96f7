"""The fp32 engine against the trainer on SmolLM2-135M-Instruct (`rlvr-models fetch smollm2-135m-instruct`;
CI fetches it for the engine environment)."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.policies import SamplingConfig, VLLMGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions
from rlvr_lightning.runtime.model_cache import is_fetched

SMOLLM2 = "smollm2-135m-instruct"
PROMPTS = ["What is 12 + 7?", "Name a colour.", "Say hi.", "Count to three."]

pytestmark = pytest.mark.skipif(not is_fetched(SMOLLM2), reason=f"{SMOLLM2} not fetched (rlvr-models fetch {SMOLLM2})")


def test_smollm2_greedy_and_log_probs_equal_the_trainers_after_a_push():
    from rlvr_lightning.policies.hf import HFPolicy

    ours = HFPolicy(model=HFModelOptions(name_or_path=SMOLLM2))
    engine = HFPolicy(
        model=HFModelOptions(name_or_path=SMOLLM2),
        generation=GenerationOptions(
            backend=VLLMGeneration(dtype="float32", kv_cache_memory_gib=0.25, max_model_len=512)
        ),
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an "update" the engine only sees through the push
        for a, b in zip(ours.parameters(), engine.parameters(), strict=True):
            noise = torch.randn(a.shape, generator=generator) * 1e-3
            a.add_(noise)
            b.add_(noise)
    greedy = SamplingConfig(do_sample=False, max_new_tokens=24)
    expected, got = ours.sample({"prompt": PROMPTS}, 1, greedy), engine.sample({"prompt": PROMPTS}, 1, greedy)
    assert torch.equal(got.response_ids, expected.response_ids) and torch.equal(
        got.response_mask, expected.response_mask
    )

    rollout = engine.sample({"prompt": PROMPTS}, 2, SamplingConfig(temperature=1.0, max_new_tokens=24))
    with torch.no_grad():
        trainer, _ = engine.token_log_probs(rollout)
    mask = rollout.response_mask.bool()
    assert (trainer - rollout.sampling_log_probs)[mask].abs().max() <= 1e-4
