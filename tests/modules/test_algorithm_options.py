"""Each algorithm option against a hand-computed case (dynamic sampling, KL in reward, mixup, contradictions)."""

import math

import pytest
import torch

from rlvr_lightning.advantages import CenteredAdvantage
from rlvr_lightning.core.losses.policy_losses import GSPO
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import (
    AggregationConfig,
    DynamicSamplingConfig,
    ImportanceSamplingConfig,
    KLConfig,
    UpdateConfig,
    ValidationConfig,
)
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import RewardCallback, SortInclusionOrderingReward
from rlvr_lightning.rollout import Rollout

from .test_rlvr_module import fit, policy


class FirstTokenParity(RewardCallback):
    """Groups of prompts starting with an even token all score 1 (zero variance); others score row parity."""

    def score(self, rollout):
        even_prompt = rollout.prompt_ids[:, 0] % 2 == 0
        parity = (rollout.response_ids[:, 0] % 2).float()
        return torch.where(even_prompt, torch.ones_like(parity), parity)


class Constant(RewardCallback):
    def score(self, rollout):
        return torch.ones(rollout.num_rows)


class _RecordingUpdate(PolicyUpdate):
    def run(self, rollout, module):
        module.trained_on = getattr(module, "trained_on", []) + [rollout]
        return super().run(rollout, module)


class UpdateSpy(RLVRModule):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy_update = _RecordingUpdate(**self.policy_update.options())


def test_dynamic_sampling_never_trains_on_a_zero_variance_group(in_tmp_dir):
    module = UpdateSpy(policy(), group_size=4, dynamic_sampling=DynamicSamplingConfig(enabled=True, max_rounds=20))
    fit(module, [FirstTokenParity(), CenteredAdvantage()], steps=3, batch_size=8)
    for rollout in module.trained_on:
        assert rollout.num_groups == 8
        rewards = rollout.reward.view(8, 4)
        assert bool((rewards.max(1).values > rewards.min(1).values).all())
    metrics = module.trainer.callback_metrics
    assert metrics["train/dynamic_sampling/rounds"] >= 1
    assert metrics["train/dynamic_sampling/prompts_sampled"] >= 8
    assert metrics["train/dynamic_sampling/filled_with_dropped"] == 0


def test_dynamic_sampling_caps_rounds_and_keeps_the_batch_size(in_tmp_dir):
    module = UpdateSpy(policy(), group_size=2, dynamic_sampling=DynamicSamplingConfig(enabled=True, max_rounds=3))
    fit(module, [Constant(), CenteredAdvantage()], steps=1, batch_size=4)
    (rollout,) = module.trained_on
    metrics = module.trainer.callback_metrics
    # every group agrees: three rounds of 4 prompts, then the batch is filled with dropped groups
    assert metrics["train/dynamic_sampling/rounds"] == 3
    assert metrics["train/dynamic_sampling/prompts_sampled"] == 12
    assert metrics["train/dynamic_sampling/filled_with_dropped"] == 4
    assert rollout.num_rows == 8 and torch.equal(rollout.advantages, torch.zeros(8))


def kl_rollout():
    # one row, two tokens; policy probs (0.5, 0.5), reference probs (0.25, 0.5)
    return Rollout(
        prompt_ids=torch.zeros(1, 3, dtype=torch.long),
        prompt_mask=torch.ones(1, 3, dtype=torch.long),
        response_ids=torch.zeros(1, 2, dtype=torch.long),
        response_mask=torch.ones(1, 2),
        group_index=torch.zeros(1, dtype=torch.long),
        group_size=1,
        truncated=torch.zeros(1, dtype=torch.bool),
        reward=torch.tensor([1.0]),
        old_log_probs=torch.log(torch.tensor([[0.5, 0.5]])),
        ref_log_probs=torch.log(torch.tensor([[0.25, 0.5]])),
    )


def test_kl_in_reward_shapes_the_reward_by_hand():
    module = RLVRModule(policy(), kl=KLConfig(coef=0.1, estimator="k1", mode="reward"))
    rollout, metrics = kl_rollout(), {}
    module._penalize_reward_with_kl(rollout, metrics)
    # k1 per token: log(0.5/0.25) = log 2 and 0; reward 1 - 0.1 * log 2 = 0.930685
    assert rollout.reward.item() == pytest.approx(1 - 0.1 * math.log(2))
    assert metrics["train/kl_reward_penalty"].item() == pytest.approx(0.1 * math.log(2))


def test_kl_in_reward_changes_the_advantages_and_not_the_loss():
    torch.manual_seed(0)
    shaped = RLVRModule(
        ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4), kl=KLConfig(coef=0.5, mode="reward")
    )
    plain = RLVRModule(shaped.policy, kl=KLConfig(coef=0.0))
    rollout = shaped.policy.sample({"prompt": [[1, 2, 3]]}, n=2, sampling=shaped.sampling)
    rollout.advantages = torch.tensor([1.0, -1.0])
    rollout.ref_log_probs = shaped.policy.token_log_probs(rollout)[0].detach() - 0.3
    mask_tokens = rollout.response_mask.sum()
    shaped_part = shaped.policy_update.micro_batch_loss(
        rollout, rollout.response_mask, MiniBatchSizes(2, mask_tokens), first_epoch=True
    )
    loss_plain = plain.policy_update.micro_batch_loss(
        rollout, rollout.response_mask, MiniBatchSizes(2, mask_tokens), first_epoch=True
    ).loss
    assert shaped_part.loss.item() == pytest.approx(loss_plain.item())
    assert shaped_part.kl is None
    kl_loss = RLVRModule(shaped.policy, kl=KLConfig(coef=0.5, mode="loss"))
    loss_with_kl = kl_loss.policy_update.micro_batch_loss(
        rollout, rollout.response_mask, MiniBatchSizes(2, mask_tokens), first_epoch=True
    ).loss
    assert loss_with_kl.item() != pytest.approx(loss_plain.item())


def test_reference_mixup_moves_the_reference_by_exactly_alpha(in_tmp_dir):
    import lightning.pytorch as pl

    class Capture(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == 1:
                self.policy = [p.detach().clone() for p in module.policy.parameters()]
                self.reference = [p.detach().clone() for p in module.reference.parameters()]

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == 1:
                self.after = [p.detach().clone() for p in module.reference.parameters()]

    capture = Capture()
    module = RLVRModule(policy(), group_size=4, kl=KLConfig(coef=0.1, refresh_every=1, mixup_alpha=0.25))
    fit(module, [SortInclusionOrderingReward(), CenteredAdvantage(), capture], steps=2, batch_size=8)
    for pol, ref, after in zip(capture.policy, capture.reference, capture.after, strict=True):
        torch.testing.assert_close(after, 0.25 * pol + 0.75 * ref)
    assert not all(torch.equal(r, a) for r, a in zip(capture.reference, capture.after, strict=True))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"loss": "gspo", "aggregation": AggregationConfig(mode="seq-mean-token-sum")}, "sequence-level objective"),
        ({"dynamic_sampling": DynamicSamplingConfig(enabled=True), "group_size": 1}, "group_size=1 every group agrees"),
        ({"sampling": SamplingConfig(do_sample=False), "group_size": 4}, "responses of a group would be identical"),
        ({"rollout_staleness": -1}, "rollout_staleness=-1 is not valid"),
    ],
)
def test_contradictory_options_fail_at_start_up(options, message):
    with pytest.raises(ValueError, match=message):
        RLVRModule(policy(), **options)


def test_gspo_builds_with_areals_token_mean():
    loss = GSPO(rollout_is_weight="row_mean", rollout_is_rejection="before_ratio")
    RLVRModule(policy(), loss=loss, aggregation=AggregationConfig(mode="token-mean"))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: KLConfig(refresh_every=10), "kl.coef=0 means there is no reference"),
        (
            lambda: KLConfig(coef=0.1, refresh_every=10, mixup_alpha=0.0),
            r"kl.mixup_alpha=0.0 is not valid: must be a finite number in \(0, 1\]",
        ),
        (lambda: KLConfig(mode="advantage"), "kl.mode='advantage' is not valid; choose one of \\['loss', 'reward'\\]"),
        (
            lambda: KLConfig(estimator="k4"),
            "kl.estimator='k4' is not valid; choose one of \\['k1', 'k2', 'k3', 'k3_is'\\]",
        ),
        (lambda: KLConfig(coef=0.0, mode="reward"), "kl.coef=0"),
        (lambda: KLConfig(coef=0.1, mixup_alpha=0.5), "kl.refresh_every is not set"),
        (
            lambda: AggregationConfig(mode="token-mean", constant=4.0),
            "aggregation.constant is the divisor of modes 'seq-sum-constant' and 'delta-l'",
        ),
        (lambda: AggregationConfig(mode="mean"), "aggregation.mode='mean' is not valid; choose one of"),
        (lambda: DynamicSamplingConfig(enabled=True, max_rounds=1), "dynamic sampling needs >= 2 rounds"),
        (lambda: ImportanceSamplingConfig(mode="token"), "rollout_is.mode='token' is not valid; choose one of"),
        (lambda: UpdateConfig(epochs=0), "update.epochs=0 is not valid: must be an integer >= 1"),
        (lambda: ValidationConfig(group_size=4), "set validation.greedy: false"),
    ],
)
def test_each_option_group_checks_itself(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_loss_that_reads_no_old_log_probs_warns_with_several_epochs(caplog):
    with caplog.at_level("WARNING"):
        RLVRModule(policy(), loss="pg", update=UpdateConfig(epochs=2))
    assert "reads no old log-probs" in caplog.text


def test_entropy_bonus_lowers_the_loss_by_exactly_c_times_the_mean_entropy():
    torch.manual_seed(0)
    toy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollout = toy.sample({"prompt": [[1, 2, 3], [0, 0, 4]]}, n=2, sampling=SamplingConfig())
    rollout.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    tokens = rollout.response_mask.sum()
    plain = (
        RLVRModule(toy, aggregation=AggregationConfig(mode="token-mean"))
        .policy_update.micro_batch_loss(rollout, None, MiniBatchSizes(4, tokens), first_epoch=True)
        .loss
    )
    bonus = (
        RLVRModule(toy, entropy_coef=0.1, aggregation=AggregationConfig(mode="token-mean"))
        .policy_update.micro_batch_loss(rollout, None, MiniBatchSizes(4, tokens), first_epoch=True)
        .loss
    )
    # the toy's distributions by hand: H = -sum p log p per position, averaged over the 12 response tokens
    probs = toy(rollout.prompt_ids).softmax(-1)
    mean_entropy = -(probs * probs.log()).sum(-1).mean()
    assert (bonus - plain).item() == pytest.approx(-0.1 * mean_entropy.item(), rel=1e-5)


class FirstRowEmptyPolicy(ToySortPolicy):
    """The first response of every rollout has no token (as an all-masked, e.g. filtered, response would)."""

    def sample(self, batch, n, sampling):
        rollout = super().sample(batch, n, sampling)
        rollout.response_mask[0] = 0
        return rollout


@pytest.mark.parametrize("count_empty_rows, expected", [(True, 8), (False, 7)])
def test_count_empty_rows_sets_the_sequence_divisor(in_tmp_dir, monkeypatch, count_empty_rows, expected):
    import rlvr_lightning.modules.update.policy_update as rlvr_module

    seen = []
    real = rlvr_module.aggregate_loss

    def spy(*args, num_sequences=None, **kwargs):
        seen.append(int(num_sequences))
        return real(*args, num_sequences=num_sequences, **kwargs)

    monkeypatch.setattr(rlvr_module, "aggregate_loss", spy)
    torch.manual_seed(0)
    policy = FirstRowEmptyPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    module = RLVRModule(policy, group_size=2, aggregation=AggregationConfig(count_empty_rows=count_empty_rows))
    fit(module, [SortInclusionOrderingReward(), CenteredAdvantage()], steps=1, batch_size=4)
    assert seen == [expected]  # 4 prompts x 2 responses, one of them empty
