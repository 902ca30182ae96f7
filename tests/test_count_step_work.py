"""scripts/count_step_work.py counts what a wrapped section launches: matrix-product FLOPs and the aten operations
below autograd that reach the device (views, allocations and operations returning no tensor left out)."""

import sys
from pathlib import Path

import pytest
import torch

from tests.script_modules import load_script as load_script_module

REPO = Path(__file__).resolve().parents[1]


def load_script():
    sys.path.insert(0, str(REPO / "scripts"))  # its sibling modules
    return load_script_module("count_step_work")


def test_kernels_leave_views_and_allocations_out():
    script = load_script()
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    with script.KernelCounter() as counter:
        product = (a @ b).t().reshape(-1)  # mm, a view, then a copy (clone) viewed flat
        torch.empty(3)  # an allocation: no kernel
        torch.promote_types(torch.float32, torch.bfloat16)  # no tensor
        (product * 2).sum()  # mul, sum
    assert dict(counter.ops) == {"mm": 1, "clone": 1, "mul": 1, "sum": 1}


def test_a_wrapped_section_counts_its_forward_and_backward_flops():
    script = load_script()
    timer = script.CountingTimer()
    weight = torch.randn(5, 3, requires_grad=True)

    class Step:
        def forward(self, x):
            return x @ weight.t()  # [4, 3] x [3, 5]: 2 * 4 * 3 * 5 = 120 FLOPs

        def backward(self, y):
            y.sum().backward()  # the gradient of the weight only: another 120

    step = Step()
    timer.wrap(step, "forward", "logprob_forward")
    timer.wrap(step, "backward", "backward")
    timer.begin()
    step.backward(step.forward(torch.randn(4, 3)))
    timer.end()
    counted = timer.steps[0]
    assert counted["logprob_forward_gflop"] == pytest.approx(120e-9)
    assert counted["backward_gflop"] == pytest.approx(120e-9)
    assert counted["logprob_forward_kernels"] == 1 and counted["backward_kernels"] >= 2  # ones_like/expand, mm
    assert counted["op:logprob_forward:mm"] == 1
