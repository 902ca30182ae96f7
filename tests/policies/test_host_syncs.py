"""Host synchronisations of the decoding loop: on a GPU every read of a device value on the host (`.item()`,
`bool(t)`, `.tolist()`, `nonzero`, boolean-mask indexing) waits for all the work queued before it. Counted
on a CPU with stand-ins: a dispatch mode that sees the operators such reads run, and `Tensor.tolist`."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlvr_lightning.demos.tiny_lm import tiny_llama_config
from rlvr_lightning.generation import loop as generation
from rlvr_lightning.generation import token_sampling
from rlvr_lightning.generation.loop import generate, left_pad
from rlvr_lightning.generation.output import StopStringChecker

READS = {"nonzero", "_local_scalar_dense", "is_nonzero", "masked_select", "unique", "_unique2"}


class HostSyncCounter(TorchDispatchMode):
    """Counts operators that read a device value on the host (or need its size: boolean masks), except inside
    `paused` (the model's own forward: transformers' attention-mask check reads one value per forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if not self.paused:
            if name in READS:
                self.counts[name] += 1
            elif name in ("index", "index_put", "index_put_") and any(
                isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in (args[1] or ())
            ):
                self.counts[f"{name} with a boolean mask"] += 1
        return func(*args, **(kwargs or {}))

    def count_tolist(self, monkeypatch) -> None:
        """Count `Tensor.tolist` too (a read of the device this mode does not see as an operator)."""
        tolist = torch.Tensor.tolist

        def counting_tolist(tensor):
            if not self.paused:
                self.counts["tolist"] += 1
            return tolist(tensor)

        monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)

    def uncounted(self, function):
        """`function`, with nothing counted while it runs."""

        def paused(*args, **kwargs):
            self.paused += 1
            try:
                return function(*args, **kwargs)
            finally:
                self.paused -= 1

        return paused


@pytest.fixture
def counted(monkeypatch):
    """(counter, model): `Tensor.tolist` counts too; the loop takes the path it takes on an accelerator."""
    from transformers import AutoConfig, AutoModelForCausalLM

    counter = HostSyncCounter()
    counter.count_tolist(monkeypatch)
    monkeypatch.setattr(token_sampling, "host_reads_are_free", lambda device: False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llama_config(vocab_size=64))).eval()
    monkeypatch.setattr(model, "forward", counter.uncounted(model.forward))
    return counter, model


@pytest.mark.parametrize("compact", [True, False])
def test_at_most_one_host_read_per_decoding_step(counted, compact):
    counter, model = counted
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10], [11, 12, 13]], pad_id=0)
    # rows end by EOS, by a stop string and by their prompt's cap at different steps, so rows are dropped
    stop = StopStringChecker(["ab"], decode=lambda rows: ["".join("ab"[t % 2] for t in row) for row in rows])
    torch.manual_seed(1)
    with counter:
        out = generate(
            model,
            ids,
            mask,
            4,
            max_new_tokens=24,
            eos_token_ids=[3, 4],
            pad_token_id=0,
            stop=stop,
            compact=compact,
            max_new_tokens_per_prompt=[24, 9, 17],
        )
    lengths = out.response_mask.sum(-1)
    assert out.stopped_by_string.any() and (lengths < 24).any() and out.steps > 5  # rows ended and the loop went on
    assert sum(counter.counts.values()) <= out.steps, dict(counter.counts)


def test_sampling_reads_nothing_on_the_host_on_an_accelerator(counted):
    counter, _ = counted
    probs = torch.softmax(torch.randn(8, 64), -1)
    with counter:
        token_sampling.sample_next_token(torch.randn(8, 64), temperature=0.7, top_k=5)
        token_sampling.sample_next_token(torch.randn(8, 64), top_p=0.9, suppress=torch.tensor([3]))
        token_sampling._sample_categorical(probs)
    assert not counter.counts


def test_host_values_reach_a_gpu_without_a_synchronisation(monkeypatch):
    """A CUDA copy from pageable memory synchronises; from pinned memory with non_blocking it is queued."""
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin_memory") or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: calls.append((args, kwargs)) or self)
    tensor = generation.host_to_device([2, 0, 1], torch.device("cuda", 1), torch.long)
    assert calls == ["pin_memory", ((torch.device("cuda", 1),), {"non_blocking": True})]
    assert tensor.dtype == torch.long and tensor.tolist() == [2, 0, 1]


@pytest.mark.parametrize("sync_every", [1, 4, 8])
def test_static_decoding_reads_the_host_once_per_block_of_steps(counted, monkeypatch, sync_every):
    from tests.generation.static_pairs import static_decoding_unsupported

    if static_decoding_unsupported():
        pytest.skip(static_decoding_unsupported())
    """`StaticCacheGeneration`'s loop: one read per `sync_every` decoding steps, the model's decoding forwards
    included (its 4D mask is never read on the host); only the prefill's forward (transformers' mask check, once
    per generation) is left out."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr_lightning.generation import static_cache
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.generation.static_generation import static_generate

    counter, _ = counted
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llama_config(vocab_size=64))).eval()
    paused_prefill = counter.uncounted(static_cache.prefill)
    monkeypatch.setattr(static_cache, "prefill", paused_prefill)
    monkeypatch.setattr("rlvr_lightning.generation.static_generation.prefill", paused_prefill)
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10], [11, 12, 13]], pad_id=0)
    stop = StopStringChecker(["ab"], decode=lambda rows: ["".join("ab"[t % 2] for t in row) for row in rows])
    torch.manual_seed(1)
    with counter, torch.no_grad():
        out = static_generate(
            model,
            ids,
            mask,
            4,
            SamplingConfig(max_new_tokens=24, min_new_tokens=2),
            pool=static_cache.WorkspacePool(),
            mode="none",
            sync_every=sync_every,
            stop=stop,
            eos_token_ids=[3, 4],
            pad_token_id=0,
            max_new_tokens_per_prompt=[24, 9, 17],
        )
    lengths = out.response_mask.sum(-1)
    assert out.stopped_by_string.any() and (lengths < 24).any() and out.steps > 5
    blocks = -(-out.steps // sync_every)  # the steps decoded, rounded up to whole blocks
    assert sum(counter.counts.values()) == out.stats["host_reads"] == blocks, dict(counter.counts)
