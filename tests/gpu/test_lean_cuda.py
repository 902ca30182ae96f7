"""Lean activations on a CUDA device (`HFPolicy(lean_activations=True)`: the lean RMSNorm/SwiGLU layers and the
output layer through `linear_token_log_probs`) score and train as the plain policy, in fp32 and under bf16
autocast (bf16-mixed training), padded and packed. The CPU version is tests/policies/test_lean_layers.py."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.policies.hf_options import HFModelOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")


def lean_and_plain_results(tmp_path, device: str, dtype: torch.dtype, packed: bool):
    """Log-probs, entropies and gradients of the plain and the lean policy on one sampled rollout."""
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy

    tokenizer = str(save_tiny_tokenizer(tmp_path / "tok"))
    policies = []
    for lean in (False, True):
        torch.manual_seed(0)
        policy = HFPolicy(
            model=HFModelOptions(
                config=tiny_llama_config(), tokenizer=tokenizer, lean_activations=lean, compile_layers="none"
            )
        )
        policies.append(policy.to(device))
    assert policies[1]._output_layer(entropy_gradient=False) is not None
    torch.manual_seed(0)
    prompts = ["a", "The quick brown fox jumps over", "What is 2+3? The answer"]
    rollout = policies[0].sample({"prompt": prompts}, n=2, sampling=SamplingConfig(max_new_tokens=12))
    results = []
    for policy in policies:
        policy.packed_sequences = packed
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            log_probs, entropy = policy.token_log_probs(rollout, temperature=0.9, with_entropy=True, entropy_grad=False)
            loss = (log_probs * rollout.response_mask).sum()
        loss.backward()
        results.append((log_probs.detach().float(), entropy.float(), [p.grad for p in policy.parameters()]))
    return results


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_activations_score_and_train_as_the_plain_policy(dtype, packed, tmp_path):
    (plain_lp, plain_entropy, plain_grads), (lean_lp, lean_entropy, lean_grads) = lean_and_plain_results(
        tmp_path, "cuda", dtype, packed
    )
    # bf16: one rounding of a logit (~0.03 at |logit| 4) moves a log-prob by about as much
    atol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(lean_lp, plain_lp, atol=atol, rtol=0)
    torch.testing.assert_close(lean_entropy, plain_entropy, atol=atol, rtol=0)
    for index, (a, b) in enumerate(zip(plain_grads, lean_grads, strict=True)):
        assert a is not None and b is not None and b.dtype == a.dtype == torch.float32, index
        error = float((b - a).norm() / a.norm().clamp_min(1e-12))
        assert error < (1e-4 if dtype == torch.float32 else 5e-2), (index, error)


def test_the_lean_norm_runs_torchs_fused_kernel_and_scoring_one_forward_per_row(tmp_path):
    """On CUDA the lean RMSNorm is `_fused_rms_norm` both ways (no decomposed rsqrt), and the default policy scores
    grouped rows with one forward (`share_prompt_prefix: null`: off on a GPU), as scripts/count_step_work.py assumes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    tokenizer = str(save_tiny_tokenizer(tmp_path / "tok"))
    policy = HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=tokenizer)).to("cuda")
    rollout = policy.sample({"prompt": ["a", "b c"]}, n=4, sampling=SamplingConfig(max_new_tokens=6))
    forwards = []
    decoder = policy.base_model.get_decoder()
    original = decoder.forward
    decoder.forward = lambda *a, **k: forwards.append(k["input_ids"].shape[0]) or original(*a, **k)
    with Ops() as ops:
        log_probs, _ = policy.token_log_probs(rollout)
        (log_probs * rollout.response_mask).sum().backward()
    decoder.forward = original
    assert forwards == [rollout.num_rows]
    norms = sum(type(module).__name__ == "LlamaRMSNorm" for module in policy.base_model.modules())
    assert ops.names.count("_fused_rms_norm") == ops.names.count("_fused_rms_norm_backward") == norms > 0
