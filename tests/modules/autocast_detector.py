"""Which forwards ran on stale weights: each call of a wrapped forward is recorded with its output and the
weights at the time of the call; a replay in a fresh autocast context (no cast cache) with those weights must give
the same output. Autocast caches its casts of leaf weights that require grad until the outermost context exits
(`torch.clear_autocast_cache`), so a forward after an in-place optimizer step in the same context can read the
casts made before it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

TOL = 1e-5  # a replay is the same computation: only a stale weight moves an output by more


@dataclass
class Call:
    args: tuple
    kwargs: dict
    output: Tensor
    weights: list[Tensor]
    grad: bool  # whether the call ran in grad mode
    clears: int  # `torch.clear_autocast_cache` calls before it, where `autocast_clears_counted` counts them


class Recorder:
    """Wraps `fn`; every call records its (first) output and a copy of the `modules`' parameters."""

    def __init__(self, fn: Callable, modules: Iterable[nn.Module], device_type: str = "cpu") -> None:
        self.fn, self.modules, self.device_type, self.calls = fn, list(modules), device_type, []

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        output = first.detach().float().clone()
        self.calls.append(Call(args, kwargs, output, weights(self.modules), torch.is_grad_enabled(), _clears[0]))
        return out

    def moved_calls(self) -> list[int]:
        """The calls that saw other weights than the first call did (after an optimizer step)."""
        first = self.calls[0].weights
        return [i for i, c in enumerate(self.calls) if not all(map(torch.equal, c.weights, first))]

    def stale_calls(self, replay: Callable | None = None) -> list[int]:
        """The calls whose output is not what `replay` (default: the wrapped fn under a cache-free bf16 autocast)
        gives with the weights and the grad mode of the call."""
        replay = replay or self.replay_under_autocast
        now = weights(self.modules)
        stale = []
        try:
            for i, call in enumerate(self.calls):
                load(self.modules, call.weights)
                # in the call's own grad mode: a forward may pick other kernels in grad mode (CUDA's fused
                # RMSNorm of the lean layers, SDPA's backend), whose last bits can move a bf16 rounding
                with torch.set_grad_enabled(call.grad):
                    out = replay(*call.args, **call.kwargs)
                fresh = (out[0] if isinstance(out, tuple) else out).detach().float()
                if not torch.allclose(fresh, call.output, atol=TOL, rtol=0):
                    stale.append(i)
        finally:
            load(self.modules, now)
        return stale

    def replay_under_autocast(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=torch.bfloat16, cache_enabled=False):
            return self.fn(*args, **kwargs)


def weights(modules: Iterable[nn.Module]) -> list[Tensor]:
    return [p.detach().clone() for m in modules for p in m.parameters()]


@torch.no_grad()
def load(modules: Iterable[nn.Module], values: list[Tensor]) -> None:
    for p, v in zip([p for m in modules for p in m.parameters()], values, strict=True):
        p.copy_(v)


_clears = [0]


def clears_so_far() -> int:
    return _clears[0]


@contextlib.contextmanager
def autocast_clears_counted():
    """Counts the calls of `torch.clear_autocast_cache` (each recorded call says how many came before it)."""
    real = torch.clear_autocast_cache

    def counted() -> None:
        _clears[0] += 1
        real()

    torch.clear_autocast_cache = counted
    try:
        yield
    finally:
        torch.clear_autocast_cache = real


@contextlib.contextmanager
def autocast_cache_never_cleared():
    """A deliberately stale path: `torch.clear_autocast_cache` does nothing inside (not even at the context's
    exit), and the cache is emptied for real afterwards so that nothing stale leaks into later code."""
    real = torch.clear_autocast_cache
    torch.clear_autocast_cache = lambda: None
    try:
        yield
    finally:
        torch.clear_autocast_cache = real
        real()
