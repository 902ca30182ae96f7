"""UnlikelinessReward (He et al. 2025, arXiv:2506.02355): by hand, equal to the authors' code restated, its edge cases
and a language-model run that trains on it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning.cli.app import main
from rlvr_lightning.core.advantage_estimators import normalized_advantages
from rlvr_lightning.rewards import UnlikelinessReward
from rlvr_lightning.rewards.unlikeliness import likelihood_ranks
from tests.rewards.test_math_reward import make_rollout

LENGTH_BIAS = Path(__file__).resolve().parents[2] / "configs" / "length_bias"
RECIPES = LENGTH_BIAS.parent / "recipes"


def rollout_with(scores, log_probs, lengths, group_size):
    rollout = make_rollout(["x" * n for n in lengths], group_size=group_size, lengths=lengths)
    rollout.sampling_log_probs = torch.tensor(log_probs) * rollout.response_mask
    rollout.rewards["math_accuracy"] = torch.tensor(scores)
    return rollout


def test_the_likelier_correct_responses_lose_more_by_hand():
    # one group of 4; mean log-probs -0.5, -2.0, -1.0, -0.1 -> ascending ranks 2, 0, 1, 3
    log_probs = [[-0.5, -0.5], [-3.0, -1.0], [-1.0, -1.0], [-0.1, -0.1]]
    rollout = rollout_with([1.0, 1.0, 0.0, 1.0], log_probs, [2, 2, 2, 2], group_size=4)
    reward = UnlikelinessReward(correct_reward="math_accuracy")
    assert reward.kind == "shaping" and reward.name == "unlikeliness"
    # -0.25 * rank / 4 * score: the wrong row (rank 1) and the least likely correct row (rank 0) are untouched
    assert reward(rollout).tolist() == pytest.approx([-0.125, 0.0, 0.0, -0.1875])
    half = UnlikelinessReward(penalty=0.5, correct_reward="math_accuracy")
    assert half(rollout).tolist() == pytest.approx([-0.25, 0.0, 0.0, -0.375])


def test_ranks_are_within_each_group_and_masked_tokens_do_not_count():
    # two groups of 2; row 1's second token is masked (an observation), so its mean is -0.2, not -2.1
    log_probs = [[-1.0, -1.0], [-0.2, -4.0], [-0.3, -0.3], [-0.9, -0.9]]
    rollout = rollout_with([1.0, 1.0, 1.0, 1.0], log_probs, [2, 2, 2, 2], group_size=2)
    rollout.response_mask[1, 1] = 0
    assert UnlikelinessReward(correct_reward="math_accuracy")(rollout).tolist() == pytest.approx(
        [0.0, -0.125, -0.125, 0.0]
    )


def test_a_response_without_tokens_ranks_least_likely_and_ties_keep_row_order():
    assert likelihood_ranks(torch.tensor([-1.0, float("nan"), -1.0, -3.0]), 4).tolist() == [2, 0, 3, 1]
    with pytest.raises(ValueError, match="whole groups"):
        likelihood_ranks(torch.zeros(3), 2)


def test_without_sampling_log_probs_outside_a_run_every_row_fails_and_a_bad_penalty_is_refused():
    rollout = rollout_with([1.0, 0.0], [[-1.0], [-2.0]], [1, 1], group_size=2)
    rollout.sampling_log_probs = None
    reward = UnlikelinessReward(correct_reward="math_accuracy")
    assert reward(rollout).tolist() == [0.0, 0.0] and reward.pop_errors() == 2
    assert "no trainer's policy to score them" in reward._first_error
    with pytest.raises(ValueError, match=r"penalty.*1\.5"):
        UnlikelinessReward(penalty=1.5)


def authors_advantages(scores, old_log_probs, eos_mask, index, rank_penalty, epsilon=1e-6):
    """`RayLeanTrainer._compute_advantages` (AndreHe02/rewarding-unlikely-release ca1cff0,
    verl/trainer/ppo/ray_lean_trainer.py) restated: returns the modified scores and the per-row advantages."""
    scores = scores.clone()
    old_log_probs = (old_log_probs * eos_mask).sum(-1) / (eos_mask.sum(-1) + 1e-8)  # verl's masked_mean
    modified_scores = scores.clone()
    id_to_indices = defaultdict(list)
    for i in range(scores.shape[0]):
        id_to_indices[index[i]].append(i)
    for indices in id_to_indices.values():
        group_indices = torch.tensor(indices)
        group_scores = scores[group_indices]
        group_ranks = torch.argsort(torch.argsort(old_log_probs[group_indices]))
        group_ranks = group_ranks / len(group_indices)
        group_scores = group_scores * (1 - group_ranks * rank_penalty)
        modified_scores[group_indices] = group_scores
        group_mean, group_std = torch.mean(group_scores), torch.std(group_scores)
        for i in indices:
            scores[i] = (modified_scores[i] - group_mean) / (group_std + epsilon)
    return modified_scores, scores


@pytest.mark.parametrize("penalty", [0.25, 0.6])
def test_equal_to_the_authors_code_on_random_groups(penalty):
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        groups, group_size = 4, 8
        rows = groups * group_size
        lengths = torch.randint(1, 7, (rows,), generator=generator).tolist()
        log_probs = (-torch.rand(rows, 6, generator=generator) * 3).tolist()
        scores = (torch.rand(rows, generator=generator) < 0.6).float()
        rollout = rollout_with(scores.tolist(), log_probs, lengths, group_size=group_size)
        shaping = UnlikelinessReward(penalty=penalty, correct_reward="math_accuracy")(rollout)
        total = scores + shaping  # the task reward at weight 1 plus this one
        index = [i // group_size for i in range(rows)]
        expected_scores, expected_advantages = authors_advantages(
            scores, rollout.sampling_log_probs, rollout.response_mask, index, penalty
        )
        assert torch.allclose(total, expected_scores, atol=1e-6)
        ours = normalized_advantages(total, group_size)
        assert torch.allclose(ours, expected_advantages, atol=1e-5)


def test_a_language_model_trains_on_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load((LENGTH_BIAS / "grpo.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"]["model"]["tokenizer"] = str(LENGTH_BIAS / "digits_tokenizer")
    config["trainer"]["callbacks"].insert(1, {"class_path": "rlvr_lightning.rewards.UnlikelinessReward"})
    path = tmp_path / "unlikely.yaml"
    path.write_text(yaml.safe_dump(config))
    quick = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    quick += ["--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp_path}"]
    cli = main(
        ["fit", "--config", str(path), *quick, "--data.init_args.batch_size=8", "--model.update.mini_batch_size=32"]
    )
    rollout = cli.model.last_rollout
    task = rollout.rewards["sort_and_stop"]
    means = (rollout.sampling_log_probs * rollout.response_mask).sum(-1) / rollout.response_mask.sum(-1)
    ranks = means.view(-1, 8).argsort(-1).argsort(-1).view(-1).float()
    assert torch.allclose(rollout.rewards["unlikeliness"], -0.25 * ranks / 8 * task)
    assert torch.allclose(rollout.reward, task * (1 - 0.25 * ranks / 8))
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_a_policy_that_records_no_log_probs_is_ranked_by_the_trainers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load((RECIPES / "grpo.yaml").read_text())
    config["trainer"]["callbacks"].insert(1, {"class_path": "rlvr_lightning.rewards.UnlikelinessReward"})
    path = tmp_path / "unlikely.yaml"
    path.write_text(yaml.safe_dump(config))
    quick = ["--trainer.limit_train_batches=1", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    quick += ["--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp_path}"]
    quick += ["--data.init_args.batch_size=16", "--model.update.mini_batch_size=64"]
    cli = main(["fit", "--config", str(path), *quick])
    rollout = cli.model.last_rollout
    assert rollout.sampling_log_probs is None  # ToySortPolicy records none
    # the old log-probs (the trainer's, before the update) rank the responses
    means = (rollout.old_log_probs * rollout.response_mask).sum(-1) / rollout.response_mask.sum(-1)
    ranks = means.view(-1, 8).argsort(-1).argsort(-1).view(-1).float()
    task = rollout.rewards["sort_inclusion_ordering"]
    assert torch.allclose(rollout.rewards["unlikeliness"], -0.25 * ranks / 8 * task)
