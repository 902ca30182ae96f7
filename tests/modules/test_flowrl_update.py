"""FlowRL in the update: the module keeps a frozen reference for it (no KL term asked), hands it the reference's
log-probs and whole prompt groups, and refuses options that would cut a group or weigh responses by length."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core import FlowRL
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig
from tests.modules.test_demonstrations import fit, toy

WHOLE_GROUPS = UpdateConfig(epochs=2, mini_batch_size=8, shuffle="prompts")


class RecordedFlowRL(FlowRL):
    """FlowRL that keeps the reference log-probs and groups the update hands it."""

    def __init__(self):
        super().__init__(beta=1.0)
        self.handed = []

    def __call__(self, log_probs, old_log_probs, advantages, mask, ref_log_probs=None, group_index=None, **rest):
        self.handed.append((log_probs.detach(), ref_log_probs, group_index))
        return super().__call__(log_probs, old_log_probs, advantages, mask, ref_log_probs, group_index, **rest)


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_the_loss_reads_a_frozen_reference_and_whole_groups():
    loss = RecordedFlowRL()
    module = RLVRModule(toy(), group_size=4, loss=loss, update=WHOLE_GROUPS)
    assert module.kl.coef == 0 and module.reference is not None  # kept for the loss alone
    start = flat(module.policy)
    steps = fit(module, steps=3)
    assert torch.equal(flat(module.reference), start)  # the reference never moves
    assert not torch.equal(flat(module.policy), start)
    for log_probs, ref_log_probs, group_index in loss.handed:
        assert ref_log_probs is not None and ref_log_probs.shape == log_probs.shape
        groups = group_index.view(-1, 4)
        assert bool((groups == groups[:, :1]).all())
    # after the first update the policy has left the reference
    assert not torch.allclose(loss.handed[-1][0], loss.handed[-1][1])
    for step in steps:
        for name in ("flowrl_log_z", "flowrl_weight", "flowrl_residual"):
            assert torch.isfinite(torch.as_tensor(step[f"train/{name}"]))
    # the second epoch is off the sampling policy: the trajectory weights move away from 1
    assert any(step["train/flowrl_weight"] != pytest.approx(1.0) for step in steps)


@pytest.mark.parametrize(
    "update",
    [UpdateConfig(mini_batch_size=8), UpdateConfig(mini_batch_size=8, micro_batch_size=2, shuffle="prompts")],
)
def test_options_that_cut_a_group_are_refused_before_any_work(update):
    with pytest.raises(ValueError, match="FlowRL reads whole prompt groups in each micro-batch: set update.shuffle"):
        RLVRModule(toy(), group_size=4, loss=FlowRL(), update=update)


def test_another_aggregation_is_refused():
    with pytest.raises(ValueError, match="FlowRL's loss is one squared error per response"):
        RLVRModule(toy(), group_size=4, loss="flowrl", aggregation=AggregationConfig(mode="token-mean"))
