import math

import lightning.pytorch as pl
import pytest
import torch

from rlvr_lightning.advantages import AdvantageCallback, CenteredAdvantage, GroupNormalizedAdvantage, RLOOAdvantage
from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import AggregationConfig, KLConfig, UpdateConfig, ValidationConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward


class MetricsRecorder(pl.Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def fit(module, callbacks, steps=3, batch_size=4, val=False, **trainer_kwargs):
    pl.seed_everything(0)
    data = RLVRDataModule(SortTask(vocab_size=5, length=3, num_val=8 if val else 0), batch_size=batch_size)
    recorder = MetricsRecorder()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=steps,
        limit_val_batches=1 if val else 0,
        val_check_interval=steps if val else None,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, recorder],
        **trainer_kwargs,
    )
    trainer.fit(module, data)
    return trainer, recorder


def policy():
    torch.manual_seed(0)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)


def test_logs_every_documented_metric(in_tmp_dir):
    module = RLVRModule(policy(), group_size=4, kl=KLConfig(coef=0.1), update=UpdateConfig(epochs=2))
    trainer, _ = fit(module, [SortInclusionOrderingReward(), CenteredAdvantage()], val=True)
    metrics = trainer.callback_metrics
    for key in [
        "train/reward_mean",
        "train/reward_std",
        "train/reward_min",
        "train/reward_max",
        "train/rewards/sort_inclusion_ordering",
        "train/advantage_mean",
        "train/advantage_std",
        "train/zero_variance_groups",
        "train/loss",
        "train/kl",
        "train/entropy",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/ratio_mean",
        "train/ratio_min",
        "train/ratio_max",
        "train/grad_norm",
        "train/skipped_updates",
        "time/step_s",
        "val/reward_mean",
        "val/accuracy",
    ]:
        assert key in metrics, key
    assert 0 <= float(metrics["val/accuracy"]) <= 1


def test_default_advantage_is_grpo_and_announced(in_tmp_dir, capsys):
    module = RLVRModule(policy(), group_size=2)
    fit(module, [SortInclusionOrderingReward()], steps=1)
    assert isinstance(module.advantage_estimator, GroupNormalizedAdvantage)
    assert "GroupNormalizedAdvantage" in capsys.readouterr().out


def test_two_advantage_callbacks_are_an_error(in_tmp_dir):
    with pytest.raises(ValueError, match="exactly one AdvantageCallback"):
        fit(RLVRModule(policy(), group_size=2), [SortInclusionOrderingReward(), CenteredAdvantage(), RLOOAdvantage()])


def test_grpo_with_group_size_one_fails_at_start_up(in_tmp_dir):
    with pytest.raises(ValueError, match="group_size >= 2"):
        fit(RLVRModule(policy(), group_size=1), [SortInclusionOrderingReward()])


def test_no_reward_is_an_error(in_tmp_dir):
    with pytest.raises(ValueError, match="no RewardCallback"):
        fit(RLVRModule(policy(), group_size=2), [])


@pytest.mark.parametrize(
    "option, value, choices",
    [("loss", "ppo", "ppo_clip"), ("aggregation.mode", "mean", "token-mean"), ("kl.estimator", "k4", "k3")],
)
def test_unknown_choices_name_the_valid_ones(option, value, choices):
    build = {
        "loss": lambda: RLVRModule(policy(), loss=value),
        "aggregation.mode": lambda: AggregationConfig(mode=value),
        "kl.estimator": lambda: KLConfig(estimator=value),
    }[option]
    with pytest.raises(ValueError, match=f"{option}='{value}'.*{choices}"):
        build()


def test_micro_batch_must_divide_mini_batch():
    with pytest.raises(ValueError, match="update.micro_batch_size=3 must divide update.mini_batch_size=8"):
        RLVRModule(policy(), update=UpdateConfig(mini_batch_size=8, micro_batch_size=3))


def test_mini_batch_must_divide_the_rollout(in_tmp_dir):
    with pytest.raises(ValueError, match="update.mini_batch_size=5 must divide the rollout size"):
        fit(
            RLVRModule(policy(), group_size=4, update=UpdateConfig(mini_batch_size=5)),
            [SortInclusionOrderingReward()],
            batch_size=4,
        )


def test_reference_model_exists_only_with_kl():
    assert RLVRModule(policy(), kl=KLConfig(coef=0.0)).reference is None
    assert RLVRModule(policy(), kl=KLConfig(coef=0.1)).reference is not None


class CountingPolicy(ToySortPolicy):
    """Counts scored rows; like most policies it does not hand over its sampling log-probs."""

    rows = 0

    def sample(self, batch, n, sampling):
        rollout = super().sample(batch, n, sampling)
        rollout.old_log_probs = None
        return rollout

    def token_log_probs(self, rollout, temperature=1.0, with_entropy=False, entropy_grad=True):
        CountingPolicy.rows += rollout.num_rows
        return super().token_log_probs(rollout, temperature, with_entropy, entropy_grad)


@pytest.mark.parametrize("ppo_epochs, mini_batch_size, passes_per_step", [(1, None, 1), (2, None, 3), (1, 8, 2)])
def test_old_log_probs_are_computed_only_when_the_policy_moves(
    in_tmp_dir, ppo_epochs, mini_batch_size, passes_per_step
):
    CountingPolicy.rows = 0
    module = RLVRModule(
        CountingPolicy(vocab_size=5, prompt_length=3, embedding_dim=4),
        group_size=4,
        update=UpdateConfig(epochs=ppo_epochs, mini_batch_size=mini_batch_size),
    )
    fit(module, [SortInclusionOrderingReward()], steps=2, batch_size=4)
    # 16 rows per step, scored once per epoch, plus once more for old log-probs when the policy moves
    assert CountingPolicy.rows == 2 * 16 * passes_per_step


class ToyCountingPolicy(ToySortPolicy):
    rows = 0

    def token_log_probs(self, rollout, temperature=1.0, with_entropy=False, entropy_grad=True):
        ToyCountingPolicy.rows += rollout.num_rows
        return super().token_log_probs(rollout, temperature, with_entropy, entropy_grad)


def test_sampling_log_probs_save_the_old_log_prob_pass(in_tmp_dir):
    ToyCountingPolicy.rows = 0
    module = RLVRModule(
        ToyCountingPolicy(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=4, update=UpdateConfig(epochs=2)
    )
    fit(module, [SortInclusionOrderingReward()], steps=2, batch_size=4)
    assert ToyCountingPolicy.rows == 2 * 16 * 2  # one pass per epoch, none for the old log-probs


def final_parameters(micro_batch_size, aggregation):
    constant = 5.0 if aggregation == "seq-sum-constant" else None
    module = RLVRModule(
        policy(),
        group_size=4,
        update=UpdateConfig(micro_batch_size=micro_batch_size),
        aggregation=AggregationConfig(mode=aggregation, constant=constant),
    )
    fit(module, [SortInclusionOrderingReward()], steps=2, batch_size=4)
    return torch.cat([p.detach().flatten() for p in module.policy.parameters()])


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-sum-constant"])
def test_micro_batching_is_exact_gradient_accumulation(in_tmp_dir, aggregation):
    torch.testing.assert_close(
        final_parameters(None, aggregation), final_parameters(4, aggregation), atol=1e-6, rtol=1e-5
    )


class NaNAdvantage(AdvantageCallback):
    """A non-finite loss (a NaN reward fails its row instead: tests/rewards/test_untrusted_reward_values.py)."""

    def compute(self, rollout):
        return torch.full((rollout.num_rows,), math.nan)


def test_non_finite_updates_are_skipped_then_stop_the_run(in_tmp_dir, caplog):
    module = RLVRModule(policy(), group_size=2, update=UpdateConfig(max_consecutive_skips=3))
    before = [p.detach().clone() for p in module.policy.parameters()]
    with pytest.raises(RuntimeError, match="3 consecutive updates had a non-finite loss"):
        fit(module, [SortInclusionOrderingReward(), NaNAdvantage()], steps=5)
    assert module.policy_update.skipped_updates == 3
    names = [name for name, _ in module.policy.named_parameters()]
    warning = next(r.getMessage() for r in caplog.records if "update skipped (1 in a row)" in r.getMessage())
    assert "loss nan, gradient norm nan" in warning and f"non-finite gradients in {len(names)} parameters" in warning
    assert f"first {', '.join(names[:3])}" in warning
    for old, new in zip(before, module.policy.parameters(), strict=True):
        assert torch.equal(old, new)


def test_reference_is_refreshed_every_n_steps(in_tmp_dir):
    module = RLVRModule(policy(), group_size=2, kl=KLConfig(coef=0.1, refresh_every=2))
    fit(module, [SortInclusionOrderingReward()], steps=2)
    # refreshed at the start of step 2 only: the reference is the policy after one update, not the latest
    assert not all(
        torch.equal(r, p) for r, p in zip(module.reference.parameters(), module.policy.parameters(), strict=True)
    )
    module = RLVRModule(policy(), group_size=2, kl=KLConfig(coef=0.1, refresh_every=2))
    fit(module, [SortInclusionOrderingReward()], steps=3)
    snapshot = [p.detach().clone() for p in module.reference.parameters()]
    assert not all(torch.equal(s, p) for s, p in zip(snapshot, module.policy.parameters(), strict=True))
    initial = policy()
    assert not all(torch.equal(s, p) for s, p in zip(snapshot, initial.parameters(), strict=True))


def test_grpo_learns_the_sort_task(in_tmp_dir):
    torch.manual_seed(0)
    module = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=8),
        optimizer=lambda params: torch.optim.Adam(params, lr=0.05),
        group_size=8,
        sampling=SamplingConfig(temperature=1.0),
    )
    _, recorder = fit(module, [SortInclusionOrderingReward()], steps=60, batch_size=32)
    first = sum(s["train/reward_mean"] for s in recorder.steps[:5]) / 5
    last = sum(s["train/reward_mean"] for s in recorder.steps[-5:]) / 5
    assert last > first + 0.5, (first, last)


def test_validation_reports_pass_at_k_and_length(in_tmp_dir):
    module = RLVRModule(policy(), group_size=4, validation=ValidationConfig(group_size=4, greedy=False))
    trainer, _ = fit(module, [SortInclusionOrderingReward(), CenteredAdvantage()], val=True)
    metrics = trainer.callback_metrics
    assert {"val/pass@4", "val/response_length", "val/accuracy"} <= set(metrics)
    assert float(metrics["val/response_length"]) == 3.0  # the toy policy answers with 3 tokens
    assert float(metrics["val/pass@4"]) >= float(metrics["val/accuracy"])


def test_greedy_validation_with_several_responses_is_an_error():
    with pytest.raises(ValueError, match="set validation.greedy: false"):
        RLVRModule(policy(), validation=ValidationConfig(group_size=4, greedy=True))
