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


def test_a_learned_log_z_trains_with_the_policy_and_reads_no_group():
    # rows shuffled across mini-batches: a learned log Z needs no whole group
    module = RLVRModule(toy(), group_size=4, loss=FlowRL(log_z="learned"), update=UpdateConfig(mini_batch_size=8))
    head = module.loss_module
    assert head is module.loss._head and {id(p) for p in head.parameters()} <= {
        id(p) for p in module.optimized_parameters()
    }
    start = flat(head)
    steps = fit(module, steps=3)
    assert not torch.equal(flat(head), start)  # the same loss trains it
    assert any(key.startswith("loss_module.") for key in module.state_dict())  # checkpointed with the module
    assert len({round(step["train/flowrl_log_z"], 6) for step in steps}) == 3


def test_a_learned_log_z_is_refused_under_fsdp2_before_anything_is_sharded():
    from types import SimpleNamespace

    from rlvr_lightning.modules.policy_module import PolicyModule

    module = RLVRModule(toy(), group_size=4, loss=FlowRL(log_z="learned"), update=UpdateConfig(mini_batch_size=8))
    module._device_mesh = SimpleNamespace(mesh_dim_names=None)  # as ModelParallelStrategy sets it
    with pytest.raises(NotImplementedError, match="FlowRL's log_z: learned.*use log_z: group, or a DDP strategy"):
        PolicyModule.configure_model(module)


def test_a_run_with_a_learned_log_z_resumes_bitwise(tmp_path, monkeypatch):
    import shutil

    from tests.test_resume import logged, parameters
    from tests.test_resume_controllers import SIZES, run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(SIZES, "flowrl", (8, 32))
    learned = "--model.init_args.loss.init_args.log_z=learned"
    full = run(tmp_path, "flowrl", "full", learned)
    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = run(tmp_path, "flowrl", "resumed", learned, "--ckpt_path", "last")
    state = parameters(full.model)
    assert any(key.startswith("loss_module.") for key in state)
    for key, value in state.items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    full_log, resumed_log = (
        logged(tmp_path, "full", "train/flowrl_log_z"),
        logged(tmp_path, "resumed", "train/flowrl_log_z"),
    )
    assert sorted(resumed_log) == [3, 4, 5] and resumed_log == {step: full_log[step] for step in resumed_log}
