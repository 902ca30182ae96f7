"""cuDNN's attention kernel is off while a module fits on a GPU and back on after (`modules/attention_kernels.py`):
its backward returns NaN gradients for masked batches of some lengths on H100/H200 (pytorch#196678). The flag
is torch's own (`torch.backends.cuda.cudnn_sdp_enabled`), which can be set without a GPU."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules import policy_module as policy_module_file
from rlvr_lightning.modules.attention_kernels import restore_cudnn_attention, turn_off_cudnn_attention
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_rlvr_module import fit, policy


@pytest.fixture(autouse=True)
def cudnn_attention_on():
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(True)


def test_off_on_a_gpu_and_restored(monkeypatch):
    assert turn_off_cudnn_attention(torch.device("cpu")) is None and torch.backends.cuda.cudnn_sdp_enabled()
    was_on = turn_off_cudnn_attention(torch.device("cuda", 0))
    assert was_on is True and not torch.backends.cuda.cudnn_sdp_enabled()
    assert turn_off_cudnn_attention(torch.device("cuda", 0)) is False  # already off: restoring keeps it off
    restore_cudnn_attention(was_on)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setenv("RLVR_CUDNN_ATTENTION", "1")
    assert turn_off_cudnn_attention(torch.device("cuda", 0)) is None and torch.backends.cuda.cudnn_sdp_enabled()


class CudnnFlagDuringTraining(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.enabled = torch.backends.cuda.cudnn_sdp_enabled()


def test_fit_turns_it_off_for_its_duration_on_a_gpu(monkeypatch, in_tmp_dir):
    """The module's device is the CPU here; the module asks for its own device, answered as a GPU would be."""
    devices = []

    def as_on_a_gpu(device):
        devices.append(device)
        return turn_off_cudnn_attention(torch.device("cuda", 0))

    monkeypatch.setattr(policy_module_file, "turn_off_cudnn_attention", as_on_a_gpu)
    flag = CudnnFlagDuringTraining()
    fit(RLVRModule(policy(), group_size=2), [SortInclusionOrderingReward(), flag], steps=1)
    assert devices == [torch.device("cpu")] and flag.enabled is False
    assert torch.backends.cuda.cudnn_sdp_enabled()  # teardown turned it back on
