"""Left-padded batches train with finite gradients on the GPU under fit's attention kernels. cuDNN's fused
attention (torch's first choice on H100/H200 since 2.11 when a mask is passed) returns NaN query gradients for
sequences 64 longer than a multiple of 128 whose rows include one that attends to nothing (pytorch#196678): a
left-padded batch's padding rows. Fit turns that kernel off (`modules/attention_kernels.py`; the CPU stand-in is
tests/modules/test_attention_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.policies.hf_options import HFModelOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")


def padded_scoring_gradients(tmp_path, device: str) -> list[torch.Tensor]:
    """The gradients of the summed log-probs of a left-padded rollout scored over 192 positions, bf16 autocast."""
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(
            config=tiny_llama_config(max_position_embeddings=512),
            tokenizer=str(save_tiny_tokenizer(tmp_path / "tok")),
            attn_implementation="sdpa",
        )
    ).to(device)
    prompts = ["a", "The quick brown fox jumps over the lazy dog. " * 3 + "What is 2+3? The answer"]
    sampling = SamplingConfig(max_new_tokens=160, min_new_tokens=160)
    rollout = policy.sample({"prompt": prompts}, n=2, sampling=sampling)
    width = int(rollout.prompt_mask.bool().any(0).sum())  # the prompt columns the scoring forward keeps
    assert int((rollout.prompt_mask == 0).sum()) > 0  # left padding: rows that attend to nothing
    t = (64 + 1 - width) % 128 or 128  # the forward runs width + t - 1 positions: 64 more than a multiple of 128
    rollout.response_mask.zero_()
    rollout.response_mask[:, :t] = 1
    policy.share_prompt_prefix = False  # the joint forward over the padded rows
    with torch.autocast(device, dtype=torch.bfloat16):
        log_probs, _ = policy.token_log_probs(rollout)
        loss = (log_probs * rollout.response_mask).sum()
    loss.backward()
    assert (width + t - 1) % 128 == 64
    return [p.grad for p in policy.parameters()]


def test_left_padded_scoring_has_finite_gradients_under_fits_kernels(tmp_path):
    from rlvr_lightning.modules.attention_kernels import restore_cudnn_attention, turn_off_cudnn_attention

    was_on = turn_off_cudnn_attention(torch.device("cuda"))
    try:
        grads = padded_scoring_gradients(tmp_path, "cuda")
    finally:
        restore_cudnn_attention(was_on)
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
