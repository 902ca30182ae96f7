"""`update.micro_batch_tokens`: packed micro-batches give the padded row micro-batches' loss and gradients (within
1e-5, fp32) for every policy loss and every aggregation mode, with the KL and entropy terms, a distillation
teacher, and PPO's critic; the old, reference and teacher log-probs and the critic's values agree too; a bad
budget is a short error naming the option."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.aggregation import AGGREGATION_MODES
from rlvr_lightning.core.losses import policy_losses, sequence_losses, soft_losses
from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.distillation import Teacher
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.modules.update.value_update import ValueUpdate
from rlvr_lightning.modules.value_model import ValueHead, trainable_copy
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions
from tests.packed_rows import RESPONSE_LENGTHS, uneven_rollout

# every built-in loss class, found in its module: a new one is tested without being listed here
LOSSES = sorted(
    {
        cls
        for module in (policy_losses, sequence_losses, soft_losses)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, PolicyLoss) and cls is not PolicyLoss and not inspect.isabstract(cls)
    },
    key=lambda cls: cls.__name__,
)
ROWS, MINI_BATCH = 6, 3  # two optimizer steps: the old log-probs are read
PADDED = UpdateConfig(mini_batch_size=MINI_BATCH, micro_batch_size=1, max_grad_norm=None)
PACKED = UpdateConfig(mini_batch_size=MINI_BATCH, micro_batch_tokens=26, max_grad_norm=None)
SAMPLING = SamplingConfig(max_new_tokens=max(RESPONSE_LENGTHS), temperature=0.9)


class _Optimizer:
    """Records the gradients of every step and leaves the weights alone (both runs see the same model)."""

    def __init__(self, parameters):
        self.parameters, self.steps = list(parameters), []

    def step(self):
        self.steps.append([p.grad.clone() if p.grad is not None else None for p in self.parameters])

    def zero_grad(self, set_to_none=True):
        for p in self.parameters:
            p.grad = None


class _Module:
    """What `PolicyUpdate.run` asks of the Lightning module, on one process."""

    def __init__(self, parameters):
        self.optimizer = _Optimizer(parameters)
        self.trainer = type("Trainer", (), {"strategy": None})()

    def optimizers(self):
        return self.optimizer

    def lr_schedulers(self):
        return None

    def manual_backward(self, loss):
        loss.backward()


@pytest.fixture(scope="module")
def models(tokenizer_dir):
    from rlvr_lightning.demos.tiny_lm import tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy

    def make(seed):
        torch.manual_seed(seed)
        return HFPolicy(
            model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
            generation=GenerationOptions(share_prompt_prefix=False),
        )

    policy, teacher = make(0), make(1)
    reference = policy.create_reference()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))  # a reference that differs: the KL is not 0
    return policy, reference, teacher


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    return save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def _rollout(policy, seed=0):
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=seed)
    g = torch.Generator().manual_seed(seed)
    rollout.advantages = torch.randn(ROWS, generator=g)
    rollout.correct = rollout.advantages > 0  # for a loss that reads which responses are correct (SimKO)
    with torch.no_grad():  # old log-probs off the current policy: ratios away from 1, some clipped
        old, _ = policy.token_log_probs(rollout, SAMPLING.temperature)
    rollout.old_log_probs = (old + 0.3 * torch.randn(old.shape, generator=g)) * rollout.response_mask
    return rollout


def _run(update_class, options, rollout, parameters, **extra):
    for model in (options["policy"], options.get("reference"), extra.get("critic")):
        if model is not None:
            model.packed_sequences = False  # set by the update when it packs
    update = update_class(**extra, **options)
    rollout = rollout.select(torch.arange(rollout.num_rows))  # a copy: the inputs are added to it
    update.add_old_and_reference_log_probs(rollout)
    module = _Module(parameters)
    torch.manual_seed(0)  # the same mini-batch order
    metrics = update.run(rollout, module)
    return rollout, metrics, module.optimizer.steps


def _assert_same_update(padded, packed, tol=1e-5):
    (rollout_a, metrics_a, steps_a), (rollout_b, metrics_b, steps_b) = padded, packed
    for name in ("ref_log_probs", "teacher_log_probs", "old_log_probs"):
        if getattr(rollout_a, name) is not None:
            assert_close(getattr(rollout_b, name), getattr(rollout_a, name), atol=tol, rtol=0)
    # 1e-5 absolute, relative for a loss beyond 1 (fp32 holds ~7 digits: VESPO's loss is ~30 here)
    loss = metrics_a["train/loss"]
    assert metrics_b["train/loss"] == pytest.approx(loss, abs=tol * max(1.0, abs(loss)))
    assert len(steps_a) == len(steps_b) == ROWS // MINI_BATCH
    for grads_a, grads_b in zip(steps_a, steps_b, strict=True):
        for a, b in zip(grads_a, grads_b, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert_close(b, a, atol=tol, rtol=tol)


def _options(policy, reference, loss, mode, update, **kwargs):
    return dict(
        policy=policy,
        loss=loss,
        aggregation=AggregationConfig(mode=mode),
        kl=KLConfig(coef=0.1 if reference is not None else 0.0),
        reference=reference,
        rollout_is=ImportanceSamplingConfig(),
        update=update,
        entropy_coef=0.01,
        sampling=SAMPLING,
        **kwargs,
    )


@pytest.mark.parametrize("loss_class", LOSSES, ids=lambda cls: cls.__name__)
def test_packed_update_matches_padded_for_every_loss_and_aggregation(models, loss_class):
    policy, reference, _ = models
    rollout = _rollout(policy)
    for mode in AGGREGATION_MODES:
        runs = [
            _run(PolicyUpdate, _options(policy, reference, loss_class(), mode, update), rollout, policy.parameters())
            for update in (PADDED, PACKED)
        ]
        _assert_same_update(*runs)


def test_packed_micro_batches_are_token_bounded_and_fewer(models):
    policy, reference, _ = models
    update = PolicyUpdate(**_options(policy, reference, policy_losses.PPOClip(), "token-mean", PACKED))
    rollout = _rollout(policy)
    lengths = (rollout.prompt_mask.sum(-1) + torch.tensor(RESPONSE_LENGTHS)).tolist()
    rows = update.micro_batch_rows(rollout)
    assert sorted(torch.cat(rows).tolist()) == list(range(ROWS))
    assert all(sum(lengths[i] for i in part.tolist()) <= PACKED.micro_batch_tokens for part in rows)
    assert len(rows) < ROWS  # rows share a packed sequence


def test_packed_update_with_a_distillation_teacher(models):
    policy, _, teacher_policy = models
    teacher = Teacher(teacher_policy, policy)
    rollout = _rollout(policy)
    runs = []
    for update in (PADDED, PACKED):
        teacher_policy.packed_sequences = False
        options = _options(policy, None, policy_losses.PPOClip(), "seq-mean-token-mean", update, teacher=teacher)
        runs.append(_run(PolicyUpdate, options, rollout, policy.parameters()))
    assert teacher_policy.packed_sequences  # the packed run scored the teacher packed
    _assert_same_update(*runs)


@pytest.mark.parametrize("value_model", ["separate", "shared"])
def test_packed_ppo_critic_matches_padded(models, value_model):
    from rlvr_lightning.modules.ppo_options import ValueConfig

    policy, _, _ = models
    critic = trainable_copy(policy) if value_model == "separate" else None
    head = ValueHead(policy.hidden_size)
    with torch.no_grad():
        head.linear.weight.normal_(0, 0.1)  # values that are not all 0
    parameters = [*policy.parameters(), *head.parameters(), *(critic.parameters() if critic else [])]
    rollout = _rollout(policy)
    mask = rollout.response_mask
    rollout.values = torch.randn(mask.shape) * mask
    rollout.returns = torch.randn(mask.shape) * mask
    runs, values = [], []
    for update in (PADDED, PACKED):
        options = _options(policy, None, policy_losses.PPOClip(), "token-mean", update)
        value_update = ValueUpdate(critic, head, ValueConfig(model=value_model, clip=0.2), **options)
        with torch.no_grad():
            values.append(value_update.by_micro_batch(rollout, value_update.values))
        extra = dict(critic=critic, value_head=head, value=ValueConfig(model=value_model, clip=0.2))
        runs.append(_run(ValueUpdate, options, rollout, parameters, **extra))
    assert_close(values[1], values[0], atol=1e-5, rtol=0)
    _assert_same_update(*runs)
    assert runs[1][1]["train/critic/value_loss"] == pytest.approx(
        float(runs[0][1]["train/critic/value_loss"]), abs=1e-5
    )


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (0, r"update.micro_batch_tokens=0 is not valid: must be an integer >= 1 \(or null\)"),
        (14, r"update.micro_batch_tokens=14 is smaller than a row can be \(a prompt and up to 14 response tokens\)"),
        (20, r"update.micro_batch_tokens=20 is smaller than the longest row of this step \(23 tokens"),
    ],
)
def test_a_bad_token_budget_names_the_option(models, budget, message):
    policy, _, _ = models
    with pytest.raises(ValueError, match=message):
        update = UpdateConfig(micro_batch_tokens=budget)
        PolicyUpdate(**_options(policy, None, policy_losses.PPOClip(), "token-mean", update)).micro_batch_rows(
            _rollout(policy)
        )


def test_tokens_and_rows_cannot_both_size_micro_batches():
    with pytest.raises(ValueError, match="set one of them"):
        UpdateConfig(micro_batch_size=2, micro_batch_tokens=64)
