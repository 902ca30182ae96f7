"""GVPO in the update: every micro-batch holds whole prompt groups, or the module refuses the options before any
work; cut into micro-batches of whole groups it trains as the whole mini-batch does."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.core import GVPO
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig
from tests.modules.test_demonstrations import fit, toy

SUM = AggregationConfig(mode="seq-mean-token-sum")


def trained(update: UpdateConfig, steps: int = 3):
    module = RLVRModule(toy(), group_size=4, loss=GVPO(beta=0.1), aggregation=SUM, update=update)
    logged = fit(module, steps=steps)
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()]), logged


def test_micro_batches_of_whole_groups_train_as_the_mini_batch():
    split, steps = trained(UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=4, shuffle="prompts"))
    whole, _ = trained(UpdateConfig(epochs=2, mini_batch_size=8, shuffle="prompts"))
    assert torch.allclose(split, whole, atol=1e-6)
    # the first mini-batch of a step is on-policy (s = 0); the later ones have moved
    assert all(step["train/gvpo_log_ratio_term"] > 0 for step in steps)


@pytest.mark.parametrize(
    "update",
    [
        UpdateConfig(mini_batch_size=8),  # rows shuffled: a group's rows land in different mini-batches
        UpdateConfig(mini_batch_size=8, micro_batch_size=2, shuffle="prompts"),
        UpdateConfig(micro_batch_tokens=64),
    ],
)
def test_options_that_cut_a_group_are_refused_before_any_work(update):
    with pytest.raises(ValueError, match="GVPO reads whole prompt groups in each micro-batch: set update.shuffle"):
        RLVRModule(toy(), group_size=4, loss=GVPO(), aggregation=SUM, update=update)


def test_another_aggregation_is_refused():
    with pytest.raises(ValueError, match="needs aggregation seq-mean-token-sum"):
        RLVRModule(toy(), group_size=4, loss="gvpo")


def test_kimi_k15s_mirror_descent_reads_no_group():
    loss = GVPO(center_log_ratio=False)
    module = RLVRModule(toy(), group_size=4, loss=loss, aggregation=SUM, update=UpdateConfig(mini_batch_size=8))
    steps = fit(module, steps=2)
    assert all(step["train/gvpo_log_ratio_term"] >= 0 for step in steps)
