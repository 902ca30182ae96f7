"""Dr. GRPO's bias diagnostics are logged every step by the RL modules, and are those of the trained batch."""

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.advantages import GroupNormalizedAdvantage
from rlvr_lightning.core.bias_diagnostics import group_std_quantiles, length_by_correctness, long_short_token_weights
from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.modules import PPOModule, RLVRModule
from rlvr_lightning.modules.options import AggregationConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import RewardCallback, SortAndStopReward

KEYS = [
    "length_correct",
    "length_incorrect",
    "group_reward_std_q10",
    "group_reward_std_q50",
    "group_reward_std_q90",
    "token_weight_long",
    "token_weight_short",
    "token_weight_long_over_short",
]


class Recorder(pl.Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/bias/")})


class LengthReward(RewardCallback):
    """A reward that cannot tell correctness."""

    def score(self, rollout):
        return rollout.response_mask.sum(-1)


def fit(module, callbacks, steps=3):
    pl.seed_everything(0)
    recorder = Recorder()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, recorder],
    )
    trainer.fit(module, RLVRDataModule(SortTask(vocab_size=5, length=3, num_val=0), batch_size=16))
    return recorder


def policy():
    torch.manual_seed(0)  # token 5 ends a response: lengths 1 to 6
    return ToySortPolicy(
        vocab_size=6, prompt_length=3, response_length=6, embedding_dim=8, activation="tanh", eos_token=5
    )


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "seq-sum-constant"])
def test_every_step_logs_the_diagnostics_of_the_trained_batch(aggregation):
    module = RLVRModule(policy(), group_size=4, aggregation=AggregationConfig(mode=aggregation))
    recorder = fit(module, [SortAndStopReward(stop="any", stop_bonus=0.0), GroupNormalizedAdvantage()])
    assert len(recorder.steps) == 3 and all(set(step) == {f"train/bias/{k}" for k in KEYS} for step in recorder.steps)
    rollout, last = module.last_rollout, recorder.steps[-1]
    lengths = rollout.response_mask.sum(-1)
    assert lengths.min() < lengths.max()  # the toy policy's responses vary in length
    correct = module.correctness(rollout)
    expected = {
        **length_by_correctness(rollout.response_mask, correct),
        **group_std_quantiles(rollout.reward, 4),
        **long_short_token_weights(rollout.response_mask, aggregation, module.loss_constant),
    }
    for key, value in expected.items():
        assert last[f"train/bias/{key}"] == pytest.approx(float(value), nan_ok=True), key
    # length by correctness, by hand
    if correct.any():
        assert last["train/bias/length_correct"] == pytest.approx(float(lengths[correct].float().mean()))
    assert last["train/bias/length_incorrect"] == pytest.approx(float(lengths[~correct].float().mean()))
    # only GRPO's per-response token mean weighs a long response's tokens less
    ratio = last["train/bias/token_weight_long_over_short"]
    assert ratio < 0.9 if aggregation == "seq-mean-token-mean" else ratio == pytest.approx(1.0)


def test_what_cannot_be_measured_is_not_logged():
    # no reward that tells correctness: no length-by-correctness; one response per prompt: no group std
    module = PPOModule(policy(), group_size=1)
    recorder = fit(module, [LengthReward()], steps=1)
    assert set(recorder.steps[0]) == {f"train/bias/{k}" for k in KEYS[5:]}
