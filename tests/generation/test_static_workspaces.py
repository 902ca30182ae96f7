"""A workspace (`generation/static_cache.py`) is kept between generations of one row bucket, so it meets the states
a run switches between: `trainer.validate` under `torch.inference_mode`, rollouts under `bf16-mixed` autocast
and without it (a value baseline sampled outside `training_step`). Each generation samples what the eager loop
samples in its own state; a workspace replaced by a larger one is freed at once, without waiting for the garbage
collector."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.static_cache import WorkspacePool

from .static_pairs import assert_same, run_pair, tiny_model

SAMPLING = SamplingConfig(max_new_tokens=10)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def only_workspace(pool: WorkspacePool):
    (workspace,) = next(iter(pool._by_model.values()))[1].values()
    return workspace


def test_a_workspace_built_in_inference_mode_serves_a_rollout_outside_it(llama):
    pool = WorkspacePool()
    with torch.inference_mode():  # `trainer.validate` first (a baseline before training)
        assert_same(run_pair(llama, SAMPLING, pool=pool))
    built = only_workspace(pool)
    assert_same(run_pair(llama, SAMPLING, pool=pool, seed=2))  # a training rollout in the same bucket
    assert only_workspace(pool) is built
    with torch.inference_mode():
        assert_same(run_pair(llama, SAMPLING, pool=pool, seed=3))


@pytest.mark.parametrize("autocast_first", [True, False])
def test_a_rollout_under_autocast_and_one_without_share_a_pool(llama, autocast_first):
    """Under autocast the cache holds bf16 values (float32 keys), without it float32 ones: a workspace of the other
    state is replaced, not written with the wrong dtype."""
    pool = WorkspacePool()
    for autocast in (autocast_first, not autocast_first):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            pair = run_pair(llama, SAMPLING, pool=pool)
        assert_same(pair, log_prob_tolerance=1e-2 if autocast else 1e-5)
        values = only_workspace(pool).cache.layers[0].values
        assert values.dtype == (torch.bfloat16 if autocast else torch.float32)


def test_a_replaced_workspace_is_freed_without_the_garbage_collector(llama):
    """Its decoding steps refer back to it (`step_capture.runnable_step`): the pool lets go of them too, so the old
    KV cache is freed before the new one is allocated, not at the next collection."""
    pool = WorkspacePool()
    gc.disable()
    try:
        run_pair(llama, SAMPLING, pool=pool, n=4)  # 12 rows: a bucket of 16
        old = weakref.ref(only_workspace(pool))
        run_pair(llama, SamplingConfig(max_new_tokens=70), pool=pool, n=4)  # the same bucket, 128 slots for 64
        assert only_workspace(pool) is not old() and old() is None
        kept = weakref.ref(only_workspace(pool))
        pool.clear()
        assert kept() is None
    finally:
        gc.enable()
