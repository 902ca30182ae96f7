"""Every policy loss, KL estimator and aggregation keeps to its inputs' device: forward, statistics and backward with
the inputs on the meta device (standing for the GPU; `tests/device_mixes.py`) combine no tensor left on the CPU with
them. A loss written with a constant made without naming a device fails here, on a CPU, rather than at its first
step on a GPU."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core.aggregation import AGGREGATION_MODES, PROMPT_MODE, aggregate_loss
from rlvr_lightning.core.kl import KL_ESTIMATORS
from rlvr_lightning.core.losses.policy_losses import POLICY_LOSSES, policy_loss
from rlvr_lightning.core.losses.token_selection import pick_tokens
from tests.core.test_policy_losses import call_loss
from tests.device_mixes import MixedDevices


def mixes_of(kind: str) -> list[str]:
    """The loss `kind` forward, its statistics and backward on meta tensors: the operators that mixed devices. A
    loss that picks tokens is handed a pick made on the host (the update makes it in a stage of its own)."""
    meta, loss = torch.device("meta"), policy_loss(kind)
    log_probs = torch.empty(4, 6, device=meta, requires_grad=True)
    old, mask = torch.empty(4, 6, device=meta), torch.ones(4, 6, dtype=torch.bool, device=meta)
    selected = None
    if loss.selects_tokens:
        on_host = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4), torch.ones(4, 6)
        entropy = torch.rand(4, 6) if loss.selection_reads_entropy else None
        selected = pick_tokens(loss, *on_host, entropy).to(meta)
    with MixedDevices() as mixes:
        out = call_loss(kind, log_probs, old, torch.empty(4, device=meta), mask, selected)
        out.loss.sum().backward()
        stats = out.stats
    assert log_probs.grad.device == meta and all(value.device == meta for value in stats.values())
    return mixes.mixed


@pytest.mark.parametrize("kind", sorted(POLICY_LOSSES))
def test_a_loss_leaves_no_tensor_on_the_cpu(kind):
    assert mixes_of(kind) == []


def test_a_constant_made_on_the_cpu_is_found(monkeypatch):
    """Advantages scaled in place by a 1-element CPU tensor: CUDA refuses it, the meta device lets it through."""
    from rlvr_lightning.core.losses import policy_losses

    prepare_inputs = policy_losses.prepare_inputs

    def scaled_on_the_cpu(*args):
        old, advantages, mask = prepare_inputs(*args)
        return old, advantages.mul_(torch.ones(1)), mask

    monkeypatch.setattr(policy_losses, "prepare_inputs", scaled_on_the_cpu)
    mixed = mixes_of("ppo_clip")
    assert mixed and all("policy_losses.py" in line for line in mixed), mixed


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_a_kl_estimate_leaves_no_tensor_on_the_cpu(name):
    meta = torch.device("meta")
    log_probs = torch.empty(4, 6, device=meta, requires_grad=True)
    ref, old = torch.empty(4, 6, device=meta), torch.empty(4, 6, device=meta)
    with MixedDevices() as mixes:
        KL_ESTIMATORS[name]().estimate(log_probs, ref, clamp=10.0, old_log_probs=old).sum().backward()
    assert mixes.mixed == [] and log_probs.grad.device == meta


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_an_aggregation_leaves_no_tensor_on_the_cpu(mode):
    meta = torch.device("meta")
    loss = torch.empty(4, 6, device=meta, requires_grad=True)
    mask = torch.ones(4, 6, dtype=torch.bool, device=meta)
    # each row's group's tokens and the number of groups, as the update hands them (the standalone count reads the
    # largest group index on the host)
    groups = {"group_tokens": torch.full((4,), 12.0, device=meta), "num_groups": 2} if mode == PROMPT_MODE else {}
    with MixedDevices() as mixes:
        total = aggregate_loss(loss, mask, mode, constant=6.0, **groups)
        total.backward()
    assert mixes.mixed == [] and total.device == meta and loss.grad.device == meta
