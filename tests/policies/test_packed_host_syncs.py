"""Host synchronisations of packed scoring: the micro-batches of a mini-batch are partitioned and laid out from one
read of the rows' lengths (`policies/packing.py: row_lengths`), then scored forward and backward without reading
the device again. Counted on a CPU with the stand-ins of `test_host_syncs.py`."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.modules.update.micro_batches import micro_batches, scored_in_order
from rlvr_lightning.policies import flex_packing
from rlvr_lightning.policies.hf_options import HFModelOptions
from tests.packed_rows import uneven_rollout
from tests.policies.test_host_syncs import HostSyncCounter

BUDGET = UpdateConfig(micro_batch_tokens=24)  # the rows of `uneven_rollout` in 3 or more micro-batches


@pytest.fixture
def counter(monkeypatch):
    """Counts `tolist` too; FlexAttention's CPU stand-in (an expanded mask for SDPA, not what a GPU runs) is not
    counted, nor, on the model's own kernel, its forward (transformers' packed-mask check reads one value)."""
    counter = HostSyncCounter()
    counter.count_tolist(monkeypatch)
    monkeypatch.setattr(flex_packing, "packed_flex_attention", counter.uncounted(flex_packing.packed_flex_attention))
    flex_packing.register_flex_attention.cache_clear()
    yield counter
    flex_packing.register_flex_attention.cache_clear()
    flex_packing.register_flex_attention()


def _pause_forwards(policy, counter, monkeypatch):
    """The model's and its decoder's forwards (the lean output layer runs the decoder alone) are not counted."""
    for module in (policy.model, policy.base_model.get_decoder()):
        monkeypatch.setattr(module, "forward", counter.uncounted(module.forward))


@pytest.mark.parametrize("attention", ["flex", "model"])
def test_a_mini_batch_of_packed_micro_batches_reads_the_host_once(make_policy, counter, monkeypatch, attention):
    policy = make_policy(
        model=HFModelOptions(packed_attention=attention)
    )  # prefix sharing on: packing is weighed against it, per part
    policy.packed_sequences = True
    if attention == "model":
        _pause_forwards(policy, counter, monkeypatch)
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    with counter:
        micros = list(micro_batches(rollout, BUDGET))
        for micro in micros:
            log_probs, entropy = policy.token_log_probs(micro, 0.7, with_entropy=True, entropy_grad=False)
            (log_probs.sum() + entropy.sum()).backward()
    assert len(micros) >= 3
    assert dict(counter.counts) == {"tolist": 1}, dict(counter.counts)


def test_scoring_by_micro_batch_reads_the_host_once(make_policy, counter):
    """The no-grad passes (old, reference log-probs) put the micro-batches' scores back in the rollout's order."""
    policy = make_policy(model=HFModelOptions(packed_attention="flex"))
    policy.packed_sequences = True
    rollout = uneven_rollout(policy.hf_config.vocab_size)
    from rlvr_lightning.modules.update.micro_batches import micro_batch_parts

    with counter, torch.no_grad():
        parts = micro_batch_parts(rollout, BUDGET)
        scored = scored_in_order(rollout, parts, lambda micro: policy.token_log_probs(micro, 0.7)[0])
    assert len(parts) >= 3 and dict(counter.counts) == {"tolist": 1}, dict(counter.counts)
    policy.packed_sequences = False
    with torch.no_grad():
        torch.testing.assert_close(scored, policy.token_log_probs(rollout, 0.7)[0], atol=1e-5, rtol=0)
