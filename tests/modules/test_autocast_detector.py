"""The stale-weights detector (tests/modules/autocast_detector.py) replays each call as it ran: a forward that
computes differently in grad mode (on CUDA the lean layers' fused RMSNorm, SDPA's backend choice) is not stale."""

from __future__ import annotations

import torch
from torch import nn

from tests.modules.autocast_detector import Recorder


def test_a_forward_that_rounds_otherwise_in_grad_mode_is_not_flagged_stale():
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)

    def forward(x):
        y = layer(x)
        # stands for another kernel's rounding: one bf16 step, far beyond the detector's tolerance
        return y * (1 + torch.finfo(torch.bfloat16).eps) if torch.is_grad_enabled() else y

    recorder = Recorder(forward, [layer])
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        with torch.no_grad():
            recorder(x)
        recorder(x).sum().backward()
    assert [call.grad for call in recorder.calls] == [False, True]
    assert recorder.stale_calls() == []


def test_a_call_after_an_in_place_update_under_a_cached_autocast_is_stale():
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    recorder = Recorder(layer, [layer])
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the cache keeps the first call's cast of the weight
        recorder(x).sum().backward()
        with torch.no_grad():
            layer.weight.add_(0.5)
        recorder(x).sum().backward()
    torch.clear_autocast_cache()
    assert recorder.moved_calls() == [1]
    assert recorder.stale_calls() == [1]
