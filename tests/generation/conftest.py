from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the tiny model, tokenizers and policies of the policy tests (one torch thread, offline)
from tests.policies.conftest import _one_thread, make_policy, tokenizer_dir, tool_tokenizer_dir  # noqa: F401


@pytest.fixture
def eager_without_compaction(monkeypatch):
    """`KVCacheGeneration` keeps finished rows in the batch (`generate(compact=False)`), the random stream static
    decoding reproduces."""
    import functools

    from rlvr_lightning.generation import loop

    monkeypatch.setattr(loop, "generate", functools.partial(loop.generate, compact=False))


@pytest.fixture
def compile_counts():
    """Graphs dynamo compiled and graph breaks it met during the test."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items) -> None:
    from tests.generation.static_pairs import static_decoding_unsupported

    reason = static_decoding_unsupported()
    if reason is not None:
        for item in items:
            if "tests/generation/" in str(item.fspath).replace(os.sep, "/"):
                item.add_marker(pytest.mark.skip(reason=reason))
