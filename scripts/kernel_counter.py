"""`KernelCounter`: the aten operations that reach the device below autograd, by name, counted rather than timed.

Views, allocations and operations that return no tensor (`promote_types`) are left out; on a GPU each of the rest
launches at least one kernel (~5-10 us from Python), so the count is what bounds small work there, and it does not
depend on the device or on how busy the machine is. Work inside a compiled graph or a replayed CUDA graph is not
dispatched from Python, so it is not counted.
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

# allocations and metadata: no kernel (`_unsafe_view` is a view that autograd does not track as one)
NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh", "set_"}
NO_KERNEL |= {"_unsafe_view"}


class KernelCounter(TorchDispatchMode):
    """Counts the aten operations dispatched below autograd that launch work on the device, by name (those that
    return no tensor, such as `promote_types`, launch nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        returns_tensors = any("Tensor" in str(r.type) for r in func._schema.returns)
        if returns_tensors and not func.is_view and name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))
