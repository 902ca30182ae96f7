"""MeanLogProbReward, EM-RL-sequence's label-free reward (arXiv:2505.15134): each response's mean sampled log-prob,
by hand; a generator without log-probs fails every row; a language-model run trains on it alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning.cli.app import main
from rlvr_lightning.rewards import MeanLogProbReward
from tests.rewards.test_math_reward import make_rollout

LENGTH_BIAS = Path(__file__).resolve().parents[2] / "configs" / "length_bias"


def test_the_mean_log_prob_of_each_response_by_hand():
    rollout = make_rollout(["abc", "d", "ef"], lengths=[3, 1, 2])
    rollout.sampling_log_probs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0], [-4.0, -2.0, 0.0]])
    rollout.response_mask[2, 1] = 0  # a token inserted into the response (a tool's output): not the policy's
    reward = MeanLogProbReward()
    assert reward(rollout).tolist() == [-2.0, -0.5, -4.0]
    assert reward.kind == "shaping" and reward.name == "mean_log_prob"


def test_a_response_without_tokens_scores_the_failure_value_and_no_log_probs_fail_every_row():
    rollout = make_rollout(["ab", ""], lengths=[2, 1])
    rollout.response_mask[1] = 0
    rollout.sampling_log_probs = torch.tensor([[-1.0, -3.0], [0.0, 0.0]])
    reward = MeanLogProbReward()
    assert reward(rollout).tolist() == [-2.0, -20.0] and reward.pop_errors() == 1
    rollout.sampling_log_probs = None
    fresh = MeanLogProbReward()
    assert fresh(rollout).tolist() == [-20.0, -20.0] and fresh.pop_errors() == 2
    assert "rollout.sampling_log_probs" in fresh._first_error


def test_a_language_model_trains_on_it_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load((LENGTH_BIAS / "grpo.yaml").read_text())
    config["model"]["init_args"]["policy"]["init_args"]["model"]["tokenizer"] = str(LENGTH_BIAS / "digits_tokenizer")
    config["trainer"]["callbacks"] = [
        {"class_path": "rlvr_lightning.rewards.MeanLogProbReward"},
        {"class_path": "rlvr_lightning.rewards.SortAndStopReward", "init_args": {"stop": "any", "weight": 0.0}},
    ]
    path = tmp_path / "emrl.yaml"
    path.write_text(yaml.safe_dump(config))
    quick = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    quick += ["--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp_path}"]
    cli = main(
        ["fit", "--config", str(path), *quick, "--data.init_args.batch_size=8", "--model.update.mini_batch_size=32"]
    )
    rollout = cli.model.last_rollout
    expected = (rollout.sampling_log_probs * rollout.response_mask).sum(-1) / rollout.response_mask.sum(-1)
    assert torch.allclose(rollout.rewards["mean_log_prob"], expected)
    assert torch.allclose(rollout.reward, expected)  # SortAndStopReward's weight is 0
    assert (expected < 0).all() and rollout.rewards["sort_and_stop"].max() >= 0
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert cli.trainer.callback_metrics["train/rewards/mean_log_prob"] == pytest.approx(float(expected.mean()))


def emrl_sequence_rewards(log_probs, lengths):
    """The authors' `EMRLSequenceRewardManager.__call__` (chotkrin/EM_PT 8428ba9, EM-RL/verl) restated: each
    response's `old_log_probs[:valid_response_length].mean()`."""
    return torch.stack([row[:length].mean() for row, length in zip(log_probs, lengths, strict=True)])


def test_equal_to_the_authors_reward_on_random_single_turn_rows():
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (32,), generator=generator).tolist()
    rollout = make_rollout(["x" * n for n in lengths], lengths=lengths)
    log_probs = -torch.rand(32, 8, generator=generator) * 5
    rollout.sampling_log_probs = log_probs * rollout.response_mask  # 0 where masked, as the generators record
    assert torch.allclose(MeanLogProbReward()(rollout), emrl_sequence_rewards(log_probs, lengths))
