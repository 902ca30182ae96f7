"""MiniLLM's long-term part (`distillation.future_gamma`): each token's distillation advantage is the discounted sum
of those from it to the end of its response, length-normalised: by hand, against TRL's `_compute_advantage`
restated, and in the loss."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.distillation import discounted_future_sum, distillation_loss
from rlvr_lightning.modules.distillation import DistillationConfig


def test_discounted_future_sums_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0]])
    # t=2: 3; t=1: 2 + 0.5 x 3 = 3.5; t=0: 1 + 0.5 x 3.5 = 2.75; discounts 1, 1.5, 1.75
    assert_close(discounted_future_sum(values, None, 0.5, False), torch.tensor([[2.75, 3.5, 3.0]]))
    assert_close(discounted_future_sum(values, None, 0.5, True), torch.tensor([[2.75 / 1.75, 3.5 / 1.5, 3.0]]))
    # gamma 1, normalised: the mean of what follows; a padded last token adds nothing and gets 0
    mask = torch.tensor([[True, True, False]])
    assert_close(discounted_future_sum(values, mask, 1.0, True), torch.tensor([[1.5, 2.0, 0.0]]))
    # gamma 0: each token alone
    assert_close(discounted_future_sum(values, None, 0.0, True), values)


def trl_compute_advantage(student, teacher, mask, gamma):
    """TRL `MiniLLMTrainer._compute_advantage` (trl/experimental/minillm/minillm_trainer.py), length-normalised."""
    mask = mask.float()
    rewards = teacher * mask - student * mask
    gamma_pow = torch.pow(gamma, torch.arange(student.size(1), dtype=student.dtype))
    advantages = (rewards * gamma_pow).flip(1).cumsum(dim=1).flip(1)
    mask = torch.where(mask < 0.5, 1e-4, mask)
    lengths = (mask * gamma_pow).flip(1).cumsum(dim=1).flip(1)
    return advantages / lengths


@pytest.mark.parametrize("gamma", [0.5, 0.9, 1.0])
def test_the_normalised_sums_equal_trls_on_responses_of_several_lengths(gamma):
    torch.manual_seed(0)
    student, teacher = -torch.rand(4, 6, dtype=torch.float64) * 3, -torch.rand(4, 6, dtype=torch.float64) * 3
    whole = torch.ones(4, 6, dtype=torch.bool)
    assert_close(
        discounted_future_sum(teacher - student, whole, gamma, True),
        trl_compute_advantage(student, teacher, whole, gamma),
    )
    # padded rows: TRL's divisor counts each padding token as 1e-4 (against a division by zero), ours as 0
    mask = torch.arange(6) < torch.tensor([6, 4, 1, 3]).unsqueeze(1)
    ours = discounted_future_sum((teacher - student).masked_fill(~mask, 0.0), mask, gamma, True)
    assert_close(ours[mask], trl_compute_advantage(student, teacher, mask, gamma)[mask], rtol=1e-3, atol=0.0)


def test_the_loss_at_the_first_update_is_minus_the_summed_advantage_and_its_gradient_follows():
    torch.manual_seed(1)
    log_probs = (-torch.rand(2, 4, dtype=torch.float64)).requires_grad_()
    teacher = -torch.rand(2, 4, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    out = distillation_loss(log_probs, None, teacher, mask, future_gamma=0.8)
    advantages = discounted_future_sum((teacher - log_probs.detach()).masked_fill(~mask, 0.0), mask, 0.8, True)
    assert_close(out.loss, (-advantages).masked_fill(~mask, 0.0))  # ratio 1: -A_t
    out.loss.sum().backward()
    assert_close(log_probs.grad, (-advantages).masked_fill(~mask, 0.0))  # d(-A_t r_t)/d log pi_t = -A_t
    unsummed = distillation_loss(log_probs.detach(), None, teacher, mask)
    assert not torch.allclose(unsummed.loss, out.loss)


def test_future_gamma_is_refused_where_it_means_nothing():
    with pytest.raises(ValueError, match="future_gamma=0.5 applies to distillation.mode=sampled_token"):
        DistillationConfig(mode="topk_logits", future_gamma=0.5)
    with pytest.raises(ValueError, match="length_normalization=false applies to distillation.future_gamma > 0"):
        DistillationConfig(length_normalization=False)


def test_a_distillation_run_with_future_gamma(in_tmp_dir):
    from pathlib import Path

    from rlvr_lightning.cli.app import main

    recipe = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "distill.yaml"
    quick = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.logger=false"]
    quick += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    cli = main(["fit", "--config", str(recipe), *quick, "--model.init_args.distillation.future_gamma=0.9"])
    assert cli.model.policy_update.distillation.future_gamma == 0.9
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
