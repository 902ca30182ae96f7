"""`GLOBAL_RANDOM_LOCK`: compiling beside the training thread without rewinding its random stream.

`torch.compile` puts torch's global generators (CPU and CUDA) and Python's `random` back as it found them when a
compilation ends (dynamo's `preserve_global_state`), and inductor's CUDA-graph recording does the same for the
CUDA generator. In a background thread (asynchronous rollouts) that is a rewind of the training thread: the
mini-batch orders it drew meanwhile are drawn again, at a point that depends on timing. So a thread compiles or
records a decoding step only while holding this lock, and the training thread holds it while it draws beside a
background rollout (from the launch to the wait, `modules/async_rollouts.py`): a compilation then never spans
one of its draws. Re-entrant, so the training thread may compile while holding it.
"""

from __future__ import annotations

import threading

GLOBAL_RANDOM_LOCK = threading.RLock()
