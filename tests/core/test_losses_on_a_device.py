"""Every policy loss, KL estimator and aggregation keeps to its inputs' device: forward, statistics and backward with
the inputs on another device than the CPU (`tests/emulated_device.py`) combine no tensor left on the CPU with them. A
loss written with a constant made without naming a device fails here, on a CPU, rather than at its first step on a
GPU."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core.aggregation import AGGREGATION_MODES, PROMPT_MODE, aggregate_loss
from rlvr_lightning.core.kl import KL_ESTIMATORS
from rlvr_lightning.core.losses.policy_losses import POLICY_LOSSES
from tests.core.test_policy_losses import call_loss
from tests.emulated_device import DEVICE, emulated_device


def _inputs():
    torch.manual_seed(0)
    log_probs = torch.randn(4, 6).clamp(max=-0.1).to(DEVICE).requires_grad_()
    old = (log_probs.detach() + 0.3 * torch.randn(4, 6).to(DEVICE)).clamp(max=-0.05)
    return (
        log_probs,
        old,
        torch.tensor([1.0, -0.5, 2.0, -1.0]).to(DEVICE),
        torch.ones(4, 6, dtype=torch.bool).to(DEVICE),
    )


def mixes_of(kind: str) -> list[str]:
    """The loss `kind` forward, its statistics and backward on the emulated device: the operators that mixed."""
    with emulated_device() as device:
        log_probs, old, advantages, mask = _inputs()
        out = call_loss(kind, log_probs, old, advantages, mask)
        out.loss.sum().backward()
        stats = out.stats
        assert log_probs.grad.device == DEVICE and all(value.device == DEVICE for value in stats.values())
    return device.mixed


@pytest.mark.parametrize("kind", sorted(POLICY_LOSSES))
def test_a_loss_leaves_no_tensor_on_the_cpu(kind):
    assert mixes_of(kind) == []


def test_a_constant_made_on_the_cpu_is_found(monkeypatch):
    from rlvr_lightning.core.losses import policy_losses

    prepare_inputs = policy_losses.prepare_inputs

    def scaled_on_the_cpu(*args):
        old, advantages, mask = prepare_inputs(*args)
        return old, advantages * torch.ones(1), mask

    monkeypatch.setattr(policy_losses, "prepare_inputs", scaled_on_the_cpu)
    mixed = mixes_of("ppo_clip")
    assert mixed and all("policy_losses.py" in line for line in mixed), mixed


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_a_kl_estimate_leaves_no_tensor_on_the_cpu(name):
    with emulated_device() as device:
        log_probs, old, _, _ = _inputs()
        ref = old - 0.2
        KL_ESTIMATORS[name]().estimate(log_probs, ref, clamp=10.0, old_log_probs=old).sum().backward()
        assert log_probs.grad.device == DEVICE
    assert device.mixed == []


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_an_aggregation_leaves_no_tensor_on_the_cpu(mode):
    with emulated_device() as device:
        loss, _, _, mask = _inputs()
        groups = torch.tensor([0, 0, 1, 1]).to(DEVICE)
        total = aggregate_loss(loss, mask, mode, constant=6.0, group_index=groups if mode == PROMPT_MODE else None)
        total.backward()
        assert total.device == DEVICE and loss.grad.device == DEVICE
    assert device.mixed == []
