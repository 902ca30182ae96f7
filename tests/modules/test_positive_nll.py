"""VAPO's positive-example LM loss (`positive_nll_coef`) by hand, under micro-batching, and in a run."""

import pytest
import torch

from rlvr_lightning.advantages import CenteredAdvantage
from rlvr_lightning.core.losses.positive_example import correct_token_count, positive_example_nll
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import PPOModule, RLVRModule
from rlvr_lightning.modules.options import AggregationConfig
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import RewardCallback, SortInclusionOrderingReward

from .test_algorithm_options import Constant
from .test_rlvr_module import fit, policy


def test_positive_example_nll_by_hand():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0], [-4.0, -4.0, -4.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).bool()
    correct = torch.tensor([True, False, True])
    # correct rows 0 and 2: real tokens -1, -2 and -4 -> (1 + 2 + 4) / 3
    count = correct_token_count(correct, mask, 3)
    assert count.item() == 3
    assert positive_example_nll(log_probs, correct, mask, count).item() == pytest.approx(7 / 3)
    # without a mask every position is real: (1 + 2 + 3 + 4 * 3) / 6
    count = correct_token_count(correct, None, 3)
    assert positive_example_nll(log_probs, correct, None, count).item() == pytest.approx(18 / 6)
    # no correct response: 0, not a division by zero
    none = torch.zeros(3, dtype=torch.bool)
    assert positive_example_nll(log_probs, none, mask, correct_token_count(none, mask, 3)).item() == 0.0


def _toy_rollout():
    torch.manual_seed(0)
    toy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollout = toy.sample({"prompt": [[1, 2, 3], [0, 0, 4]]}, n=2, sampling=SamplingConfig())
    rollout.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    rollout.correct = torch.tensor([True, False, False, True])
    return toy, rollout


def test_the_loss_grows_by_c_times_the_mean_nll_of_the_correct_responses():
    toy, rollout = _toy_rollout()
    tokens = rollout.response_mask.sum()
    num_correct = correct_token_count(rollout.correct, None, rollout.response_mask.shape[1])
    losses = {}
    for coef in (0.0, 0.1):
        module = RLVRModule(toy, aggregation=AggregationConfig(mode="token-mean"), positive_nll_coef=coef)
        num = num_correct if coef else None
        losses[coef] = module.policy_update.micro_batch_loss(rollout, None, MiniBatchSizes(4, tokens, num), True).loss
    # by hand: the toy's log-probs of the sampled tokens of rows 0 and 3, averaged over their 6 tokens
    log_probs = toy(rollout.prompt_ids).log_softmax(-1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    nll = -log_probs[[0, 3]].mean()
    assert (losses[0.1] - losses[0.0]).item() == pytest.approx(0.1 * nll.item(), rel=1e-5)


def test_micro_batches_add_up_to_the_mini_batch():
    toy, rollout = _toy_rollout()
    module = RLVRModule(toy, aggregation=AggregationConfig(mode="token-mean"), positive_nll_coef=0.5)
    update = module.policy_update
    tokens = rollout.response_mask.sum()
    num_correct = correct_token_count(rollout.correct, None, rollout.response_mask.shape[1])
    grads = []
    for parts in ([slice(0, 4)], [slice(0, 1), slice(1, 3), slice(3, 4)]):
        toy.zero_grad()
        for rows in parts:
            update.micro_batch_loss(
                rollout.select(rows), None, MiniBatchSizes(4, tokens, num_correct), True
            ).loss.backward()
        grads.append([p.grad.clone() for p in toy.parameters()])
    for whole, split in zip(*grads, strict=True):
        torch.testing.assert_close(whole, split)


class FirstTokenEven(RewardCallback):
    """1 for a response that starts with an even token, which is then correct (about half of them)."""

    def score(self, rollout):
        return (rollout.response_ids[:, 0] % 2 == 0).float()

    def is_correct(self, rollout, scores):
        return scores > 0


def test_a_run_logs_the_nll_of_the_correct_responses(in_tmp_dir):
    module = RLVRModule(policy(), group_size=4, positive_nll_coef=0.1)
    trainer, recorder = fit(module, [FirstTokenEven(), CenteredAdvantage()], steps=3, batch_size=8)
    logged = [float(step["train/positive_nll"]) for step in recorder.steps]
    assert len(logged) == 3 and all(0 < value < 10 for value in logged)
    correct = module.last_rollout.correct
    assert correct.dtype == torch.bool and torch.equal(correct, module.last_rollout.response_ids[:, 0] % 2 == 0)


def test_a_step_without_a_correct_response_logs_nan(in_tmp_dir):
    # the toy sorts 3 of 5 tokens exactly: none does in the first steps
    module = RLVRModule(policy(), group_size=4, positive_nll_coef=0.1)
    trainer, recorder = fit(module, [SortInclusionOrderingReward(), CenteredAdvantage()], steps=1, batch_size=8)
    assert not bool(module.last_rollout.correct.any())
    assert torch.isnan(torch.as_tensor(recorder.steps[0]["train/positive_nll"]))
    assert torch.isfinite(torch.as_tensor(recorder.steps[0]["train/loss"]))


def test_ppo_adds_it_to_its_loss(in_tmp_dir):
    # one step, one update: the same samples and the same first forward, so the losses differ by c * NLL exactly
    losses, nll = {}, None
    for coef in (0.0, 0.5):
        module = PPOModule(policy(), group_size=2, positive_nll_coef=coef)
        trainer, recorder = fit(module, [FirstTokenEven()], steps=1, batch_size=8)
        losses[coef] = float(recorder.steps[0]["train/loss"])
        nll = recorder.steps[0].get("train/positive_nll", nll)
    assert float(nll) > 0
    assert losses[0.5] - losses[0.0] == pytest.approx(0.5 * float(nll), rel=1e-4)


def test_a_reward_that_cannot_tell_correctness_is_refused(in_tmp_dir):
    module = RLVRModule(policy(), group_size=2, positive_nll_coef=0.1)
    with pytest.raises(ValueError, match="positive_nll_coef > 0 trains on which responses are correct"):
        fit(module, [Constant(), CenteredAdvantage()], steps=1)
