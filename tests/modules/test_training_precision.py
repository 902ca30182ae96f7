"""Training precisions that lose the update are refused at the start of fit, naming the options and the fix."""

from __future__ import annotations

import types

import pytest
import torch

from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.training_precision import check_training_precision
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_rlvr_module import fit


def toy_policy(dtype=torch.float32):
    torch.manual_seed(0)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4).to(dtype)


def test_bf16_weights_without_fp32_masters_are_refused(in_tmp_dir):
    with pytest.raises(
        ValueError,
        match=r"loaded in torch.bfloat16 \(its model.dtype option\) and trainer.precision='32-true'.*"
        r"load the policy with model.dtype: float32 and train with trainer.precision: bf16-mixed",
    ):
        fit(RLVRModule(toy_policy(torch.bfloat16), group_size=4), [SortInclusionOrderingReward()], steps=1)


def test_bf16_true_is_refused_for_trainable_weights(in_tmp_dir):
    with pytest.raises(
        ValueError,
        match=r"trainer.precision='bf16-true' converts every weight to torch.bfloat16.*"
        r"train with trainer.precision: bf16-mixed over fp32 weights",
    ):
        fit(RLVRModule(toy_policy(), group_size=4), [SortInclusionOrderingReward()], steps=1, precision="bf16-true")


def test_fp16_loss_scaling_is_refused_under_manual_optimisation():
    # Lightning turns 16-mixed into bf16-mixed on a CPU: the trainer is a stand-in here
    module = RLVRModule(toy_policy(), group_size=4)
    module._trainer = types.SimpleNamespace(precision="16-mixed")
    with pytest.raises(
        ValueError,
        match=r"trainer.precision='16-mixed' is not supported by RLVRModule.*"
        r"Use trainer.precision: bf16-mixed",
    ):
        check_training_precision(module)


def test_fp32_masters_train(in_tmp_dir):
    module = RLVRModule(toy_policy(), group_size=4)
    before = [p.detach().clone() for p in module.policy.parameters()]
    trainer, _ = fit(module, [SortInclusionOrderingReward()], steps=2, precision="bf16-mixed")
    assert trainer.global_step > 0 and {p.dtype for p in module.policy.parameters()} == {torch.float32}
    assert any(not torch.equal(a, b) for a, b in zip(before, module.policy.parameters(), strict=True))


def stub(parameters, precision, automatic=False):
    return types.SimpleNamespace(
        trainer=types.SimpleNamespace(precision=precision),
        automatic_optimization=automatic,
        named_parameters=lambda: iter(parameters),
    )


def test_frozen_bf16_weights_and_automatic_fp16_scaling_pass():
    frozen = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16), requires_grad=False)  # a LoRA base, a reference
    adapter = torch.nn.Parameter(torch.zeros(2))
    check_training_precision(stub([("base", frozen), ("adapter", adapter)], "32-true"))
    check_training_precision(stub([("adapter", adapter)], "16-mixed", automatic=True))  # Lightning scales and unscales
    with pytest.raises(ValueError, match=r"\(base\)"):
        check_training_precision(stub([("base", frozen.requires_grad_(True))], "bf16-mixed"))


def test_a_fused_optimizer_is_clipped_under_bf16_mixed(in_tmp_dir):
    """Lightning refuses to clip for a fused optimizer under every mixed precision (fp16's loss scaler unscales
    inside a fused step); bf16 scales nothing, so the update clips it as the same optimizer unfused."""
    import functools

    from rlvr_lightning.advantages import CenteredAdvantage
    from rlvr_lightning.modules.options import UpdateConfig

    def trained(fused: bool, max_grad_norm: float | None) -> list[torch.Tensor]:
        module = RLVRModule(
            toy_policy(),
            group_size=4,
            optimizer=functools.partial(torch.optim.SGD, lr=0.5, fused=fused),
            update=UpdateConfig(max_grad_norm=max_grad_norm),
        )
        fit(module, [SortInclusionOrderingReward(), CenteredAdvantage()], steps=2, precision="bf16-mixed")
        return [p.detach().clone() for p in module.policy.parameters()]

    clipped = trained(fused=True, max_grad_norm=1e-3)
    for a, b in zip(clipped, trained(fused=False, max_grad_norm=1e-3), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    unclipped = trained(fused=True, max_grad_norm=None)
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(clipped, unclipped, strict=True))
