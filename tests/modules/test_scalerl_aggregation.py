"""ScaleRL's loss options in the update. `aggregation.mode: prompt-mean-token-mean`: each optimizer step's gradient is
that of the mean over the mini-batch's prompts of each prompt's token mean, with shuffled mini-batches that split
the prompts and micro-batches of one row. `update.shuffle: prompts`: mini-batches of whole prompt groups.
`aggregation.mask_zero_variance_groups`: the update equals the update on the rollout without the prompts whose
rewards all agree. And the options' errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import aggregate_loss
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import ExpertIterationModule, RLVRModule, SFTModule
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.policies.toy_sort import ToySortPolicy

ROWS, MINI_BATCH = 12, 6  # 3 prompts x 4; two shuffled mini-batches, each with parts of every prompt


class _RecordingModule:
    """What `PolicyUpdate.run` asks of the Lightning module; the optimizer records each step's gradients."""

    def __init__(self, parameters):
        self.parameters, self.steps = list(parameters), []
        self.trainer = type("Trainer", (), {"strategy": None})()

    def optimizers(self):
        module = self

        class _Optimizer:
            def step(self):
                module.steps.append([p.grad.clone() for p in module.parameters])

            def zero_grad(self, set_to_none=True):
                for p in module.parameters:
                    p.grad = None

        return _Optimizer()

    def lr_schedulers(self):
        return None

    def manual_backward(self, loss):
        loss.backward()


def _uneven_rollout(policy):
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": [[1, 0, 2, 3], [4, 3, 3, 1], [2, 2, 0, 4]]}, 4, SamplingConfig())
    # uneven: the prompts' token counts differ; the third prompt has none (count_empty_rows decides whether it counts)
    lengths = torch.tensor([4, 1, 2, 3, 4, 4, 1, 1, 0, 0, 0, 0])
    rollout.response_mask = (torch.arange(4) < lengths.unsqueeze(-1)).float()
    rollout.advantages = torch.randn(ROWS)
    rollout.old_log_probs = None
    return rollout


def _update(policy, aggregation, update=UpdateConfig(micro_batch_size=2), entropy_coef=0.0):
    """A policy-gradient update of `policy` (no gradient clipping: the recorded gradients are the loss's)."""
    return PolicyUpdate(
        policy=policy,
        loss=RLVRModule(policy, loss="pg").loss,
        aggregation=aggregation,
        kl=KLConfig(),
        reference=None,
        rollout_is=ImportanceSamplingConfig(),
        update=dataclasses.replace(update, max_grad_norm=None),
        entropy_coef=entropy_coef,
        sampling=SamplingConfig(),
    )


@pytest.mark.parametrize("count_empty_rows", [True, False])
def test_each_step_is_the_prompt_mean_of_its_mini_batch(count_empty_rows):
    policy = ToySortPolicy(vocab_size=5, prompt_length=4, embedding_dim=8)
    rollout = _uneven_rollout(policy)
    aggregation = AggregationConfig(mode="prompt-mean-token-mean", count_empty_rows=count_empty_rows)
    update = _update(policy, aggregation, UpdateConfig(mini_batch_size=MINI_BATCH, micro_batch_size=1))
    module = _RecordingModule(policy.parameters())
    torch.manual_seed(1)
    update.run(rollout, module)
    torch.manual_seed(1)
    order = torch.randperm(ROWS)  # the update's mini-batch order
    for step, start in enumerate(range(0, ROWS, MINI_BATCH)):
        rows = order[start : start + MINI_BATCH]
        part = rollout.select(rows)
        assert len(set(part.group_index.tolist())) == 3  # every prompt is split between the mini-batches
        log_probs, _ = policy.token_log_probs(part)
        # policy gradient -A log p per token, then the prompts' mean of their token means
        token_loss = -part.advantages.unsqueeze(-1) * log_probs
        mask = part.response_mask.bool()
        expected = torch.autograd.grad(
            aggregate_loss(
                token_loss, mask, aggregation.mode, count_empty_rows=count_empty_rows, group_index=part.group_index
            ),
            list(policy.parameters()),
        )
        for got, want in zip(module.steps[step], expected, strict=True):
            assert_close(got, want)
    # and not what the row-level mean gives: the prompts' token counts differ
    seq_mean = aggregate_loss(token_loss, mask, "seq-mean-token-mean")
    prompt_mean = aggregate_loss(token_loss, mask, aggregation.mode, group_index=part.group_index)
    assert abs(seq_mean.item() - prompt_mean.item()) > 1e-3


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "prompt-mean-token-mean"])
def test_masking_zero_variance_groups_equals_training_without_them(mode):
    policy = ToySortPolicy(vocab_size=5, prompt_length=4, embedding_dim=8)
    rollout = _uneven_rollout(policy)
    rollout.reward = torch.tensor([1.0, 0.0, 2.0, 1.0, 3.0, 3.0, 3.0, 3.0, 0.3, 0.1, 0.5, 0.2])  # prompt 1 agrees
    rollout.response_mask = torch.ones_like(rollout.response_mask)
    rollout.response_mask[[1, 6], 2:] = 0  # uneven, prompt 1 included
    kept = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
    # an entropy bonus: prompt 1's rows would add to the loss even with an advantage of 0
    masked = AggregationConfig(mode=mode, count_empty_rows=False, mask_zero_variance_groups=True)
    steps = []
    for aggregation, part in ((masked, rollout), (AggregationConfig(mode=mode), rollout.select(kept))):
        module = _RecordingModule(policy.parameters())
        _update(policy, aggregation, entropy_coef=0.1).run(part, module)
        steps.append(module.steps[0])
    for got, want in zip(*steps, strict=True):
        assert_close(got, want)
    # without the option, prompt 1 changes the update
    module = _RecordingModule(policy.parameters())
    _update(policy, AggregationConfig(mode=mode, count_empty_rows=False), entropy_coef=0.1).run(rollout, module)
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(module.steps[0], steps[1], strict=True))


def test_prompt_shuffled_mini_batches_hold_whole_prompts():
    policy = ToySortPolicy(vocab_size=5, prompt_length=4, embedding_dim=8)
    rollout = _uneven_rollout(policy)
    aggregation = AggregationConfig(mode="prompt-mean-token-mean")
    update = _update(policy, aggregation, UpdateConfig(mini_batch_size=4, micro_batch_size=1, shuffle="prompts"))
    module = _RecordingModule(policy.parameters())
    torch.manual_seed(3)
    update.run(rollout, module)
    torch.manual_seed(3)
    prompts = torch.randperm(3).tolist()  # the update's order of the prompts
    assert prompts != [0, 1, 2]  # shuffled
    for step, prompt in enumerate(prompts):
        part = rollout.select(torch.arange(4 * prompt, 4 * prompt + 4))
        log_probs, _ = policy.token_log_probs(part)
        loss = aggregate_loss(-part.advantages.unsqueeze(-1) * log_probs, part.response_mask.bool(), "token-mean")
        for got, want in zip(module.steps[step], torch.autograd.grad(loss, list(policy.parameters())), strict=True):
            assert_close(got, want)


def test_prompt_shuffling_needs_mini_batches_of_whole_prompts():
    with pytest.raises(ValueError, match="mini_batch_size=6 must be a multiple of group_size=4"):
        RLVRModule(ToySortPolicy(), group_size=4, update=UpdateConfig(mini_batch_size=6, shuffle="prompts"))
    with pytest.raises(ValueError, match="update.shuffle='prompts' does not apply"):
        ExpertIterationModule(
            ToySortPolicy(), aggregation=AggregationConfig("token-mean", count_empty_rows=False),
            update=UpdateConfig(shuffle="prompts"),
        )  # fmt: skip


def test_the_likelihood_losses_refuse_the_prompt_mean():
    with pytest.raises(ValueError, match="prompt-mean-token-mean.*not valid for a likelihood loss"):
        SFTModule(ToySortPolicy(vocab_size=5, prompt_length=4), aggregation=AggregationConfig("prompt-mean-token-mean"))
