"""ExpertIterationModule: which responses are kept, that rounds fine-tune only on them, start-up checks."""

import copy
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.expert_iteration import ExpertIterationModule
from rlvr_lightning.modules.options import AggregationConfig, UpdateConfig
from rlvr_lightning.modules.pair_rollouts import pair_rollout
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import RewardCallback, SortInclusionOrderingReward
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]


def toy(seed=0):
    torch.manual_seed(seed)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8, activation="tanh")


def fit(module, callbacks, rounds=3, batch_size=16, val=True, data=None):
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=rounds,
        limit_val_batches=1.0 if val else 0,
        val_check_interval=1 if val else None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(
        module,
        data or RLVRDataModule(SortTask(vocab_size=5, length=3, num_val=16 if val else 0), batch_size=batch_size),
    )
    return trainer


class Fixed(RewardCallback):
    """Rewards given per row, in order."""

    def __init__(self, values, **kwargs):
        super().__init__(**kwargs)
        self.values = torch.tensor(values)

    def score(self, rollout):
        return self.values[: rollout.num_rows].float()


def scored(module, rewards):
    rollout = pair_rollout(module.policy, [[1, 2, 3]] * len(rewards), [[1, 2, 3]] * len(rewards))
    rollout.group_size = module.group_size
    rollout.reward = torch.tensor(rewards, dtype=torch.float)
    return rollout


def test_threshold_and_per_prompt_cap_by_hand():
    module = ExpertIterationModule(toy(), group_size=4, reward_threshold=5.0, max_per_prompt=2)
    #         prompt 0: rows 0-3        prompt 1: rows 4-7
    rewards = [5.0, 1.0, 6.0, 7.0, 0.0, 4.9, 5.0, 0.0]
    rollout = scored(module, rewards)
    passing = module.passing(rollout)
    assert passing.tolist() == [True, False, True, True, False, False, True, False]
    # prompt 0 passes 3 times, capped at its first 2; prompt 1 once
    assert module.keep_rows(rollout, passing).tolist() == [0, 2, 6]
    module.max_per_prompt = None
    assert module.keep_rows(rollout, passing).tolist() == [0, 2, 3, 6]


def test_without_threshold_only_correct_responses_are_kept():
    module = ExpertIterationModule(toy(), group_size=2)
    module.reward_callbacks = [SortInclusionOrderingReward()]
    rollout = pair_rollout(module.policy, [[3, 1, 2], [3, 1, 2]], [[1, 2, 3], [1, 3, 2]])
    module.score(rollout)
    # the second response scores 5 of 5 on inclusion + 1 of 2 ordering = 4, but is not sorted
    assert module.passing(rollout).tolist() == [True, False]


class KeptSpy(ExpertIterationModule):
    def _fine_tune(self, kept):
        self.fine_tuned = getattr(self, "fine_tuned", []) + [kept]
        return super()._fine_tune(kept)


def test_a_round_fine_tunes_on_the_kept_responses_for_E_epochs(in_tmp_dir):
    # 16 prompts x 4 responses; reward 1 on every other row: 32 kept, 2 epochs of mini-batches of 8 = 8 steps
    module = KeptSpy(toy(), group_size=4, reward_threshold=1.0, update=UpdateConfig(epochs=2, mini_batch_size=8))
    trainer = fit(module, [Fixed([1.0, 0.0] * 32)], rounds=1, val=False)
    (kept,) = module.fine_tuned
    assert kept.num_rows == 32 and bool((kept.reward == 1).all())
    assert trainer.global_step == 8
    metrics = trainer.callback_metrics
    assert metrics["train/kept"] == 32 and metrics["train/pass_rate"] == 0.5


def test_a_round_where_nothing_passes_changes_nothing(in_tmp_dir):
    module = ExpertIterationModule(toy(), group_size=4, reward_threshold=1.0)
    before = [p.detach().clone() for p in module.policy.parameters()]
    trainer = fit(module, [Fixed([0.0] * 64)], rounds=1, val=False)
    assert trainer.global_step == 0 and trainer.callback_metrics["train/kept"] == 0
    for a, b in zip(before, module.policy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_three_rounds_raise_the_validation_accuracy_of_a_fine_tuned_start(in_tmp_dir):
    # a weak start: a few SFT steps on sorted pairs, then 3 rounds keeping exact sorts only
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=16, activation="tanh")
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.03)
    stream = iter(SortTask(vocab_size=5, length=3, seed=7).train_dataset())
    for _ in range(15):
        batch = [next(stream) for _ in range(32)]
        rollout = pair_rollout(policy, [e["prompt"] for e in batch], [e["answer"] for e in batch])
        loss = -policy.token_log_probs(rollout)[0].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    module = ExpertIterationModule(
        policy,
        optimizer=lambda p: torch.optim.Adam(p, lr=0.01),
        group_size=8,
        max_per_prompt=4,
        update=UpdateConfig(mini_batch_size=64),
    )
    start = pl.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[SortInclusionOrderingReward()]
    )
    data = RLVRDataModule(SortTask(vocab_size=5, length=3, num_val=64), batch_size=128)
    before = start.validate(module, data, verbose=False)[0]["val/accuracy"]
    trainer = fit(module, [SortInclusionOrderingReward()], rounds=3, data=data)
    assert float(trainer.callback_metrics["val/accuracy"]) > before + 0.1  # measured: 36% -> 58%
    assert float(trainer.callback_metrics["train/pass_rate"]) > 0.5  # round 1 passed 48%, round 3 91%


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_per_prompt": 9}, "max_per_prompt must be in \\[1, group_size=8\\]"),
        ({"sampling": SamplingConfig(do_sample=False)}, "responses to a prompt identical"),
        ({"update": UpdateConfig(max_consecutive_skips=3)}, "max_consecutive_skips does not apply"),
        (
            {"aggregation": AggregationConfig(mode="seq-sum-constant")},
            "aggregation.mode='seq-sum-constant' is not valid",
        ),
        ({"aggregation": AggregationConfig(mode="token-mean")}, "count_empty_rows=true does not apply"),
    ],
)
def test_contradictory_options_fail_at_start_up(options, message):
    with pytest.raises(ValueError, match=message):
        ExpertIterationModule(toy(), **options)


def test_no_task_reward_and_no_threshold_fails_at_start_up(in_tmp_dir):
    class Shaping(Fixed):
        kind = "shaping"

    with pytest.raises(ValueError, match="no reward in trainer.callbacks has kind='task'; set reward_threshold"):
        fit(ExpertIterationModule(toy(), group_size=2), [Shaping([1.0] * 32)], rounds=1)


def test_expert_iteration_stage_config_runs_through_the_cli(in_tmp_dir):
    pipeline = load_script("sft_then_grpo")
    cli = pipeline.stage_cli(
        [
            "fit",
            "--config",
            str(pipeline.EI_CONFIG),
            "--trainer.limit_train_batches=2",
            "--trainer.val_check_interval=1",
            "--trainer.limit_val_batches=1",
            "--data.init_args.batch_size=64",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
        ]
    )
    assert isinstance(cli.model, ExpertIterationModule)
    assert cli.trainer.fit_loop.epoch_loop._batches_that_stepped == 2
    assert {"train/kept", "val/accuracy"} <= set(cli.trainer.callback_metrics)


def test_the_sampling_casts_are_dropped_before_the_fine_tuning_forwards(in_tmp_dir, monkeypatch):
    # a cached autocast keeps the casts the sampling forwards made, without their gradient, and torch < 2.11 hands
    # them to later grad-mode forwards (pytorch#112583)
    from tests.modules.autocast_detector import Recorder, autocast_clears_counted, clears_so_far

    module = ExpertIterationModule(toy(), group_size=4, reward_threshold=1.0, update=UpdateConfig(mini_batch_size=8))
    sample, sampled_at = module.policy.sample, []
    monkeypatch.setattr(
        module.policy, "sample", lambda *a, **k: (sample(*a, **k), sampled_at.append(clears_so_far()))[0]
    )
    recorder = Recorder(module.policy.token_log_probs, [module.policy])
    monkeypatch.setattr(module.policy, "token_log_probs", recorder)
    with autocast_clears_counted():
        fit(module, [Fixed([1.0, 0.0] * 32)], rounds=1, val=False)
    trained = [call for call in recorder.calls if call.grad]
    assert sampled_at and trained, "no fine-tuning forward followed the sampling: the test would prove nothing"
    assert trained[0].clears > sampled_at[0]


@pytest.mark.parametrize("loss", ["nll", "dft"])
def test_a_round_trains_on_the_chosen_likelihood_loss(loss, in_tmp_dir):
    """One optimizer step over every kept row: the logged loss is that loss of the kept responses, by hand, before
    the step (`loss: dft` weighs each token's NLL by its probability, as in SFTModule)."""
    module = KeptSpy(toy(), group_size=4, reward_threshold=1.0, update=UpdateConfig(epochs=1), loss=loss)
    start = copy.deepcopy(module.policy)
    trainer = fit(module, [Fixed([1.0, 0.0] * 32)], rounds=1, val=False)
    (kept,) = module.fine_tuned
    with torch.no_grad():
        logits = start(kept.prompt_ids)
    log_probs = torch.log_softmax(logits, -1).gather(-1, kept.response_ids.unsqueeze(-1)).squeeze(-1)
    by_hand = (-log_probs.exp() * log_probs if loss == "dft" else -log_probs).mean()
    assert trainer.global_step == 1
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(float(by_hand), rel=1e-5)
