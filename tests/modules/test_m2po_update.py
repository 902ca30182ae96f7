"""M2PO in the update: its pick spans the mini-batch, and with nothing to drop it trains exactly as the unclipped
importance ratio does."""

from __future__ import annotations

import torch

from rlvr_lightning.core import M2PO, ImportanceRatio
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import UpdateConfig
from tests.modules.test_demonstrations import fit, toy

UPDATE = UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=4)  # 16 rows: 4 optimizer steps a rollout


def trained(loss, update=UPDATE, steps=3):
    module = RLVRModule(toy(), group_size=4, loss=loss, update=update)
    steps = fit(module, steps=steps)
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()]), steps


def test_with_a_bound_nothing_reaches_it_trains_as_the_importance_ratio_to_the_bit():
    """One epoch of four mini-batches of two micro-batches, one step (the pick's generator draws its seed from the
    global random stream, which later shuffles and samples would then see)."""
    update = UpdateConfig(epochs=1, mini_batch_size=4, micro_batch_size=2)
    m2po, steps = trained(M2PO(m2_threshold=1e9), update, steps=1)
    ratio, _ = trained(ImportanceRatio(), update, steps=1)
    assert torch.equal(m2po, ratio)
    assert all(step["train/m2_masked_frac"] == 0.0 for step in steps)


def test_a_tight_bound_drops_tokens_once_the_policy_moves():
    parameters, steps = trained(M2PO(m2_threshold=0.0))
    fractions = [step["train/m2_masked_frac"] for step in steps]
    assert all(0.0 < f < 1.0 for f in fractions)  # the first mini-batch of each step is on-policy (log r = 0)
    assert parameters.isfinite().all()
