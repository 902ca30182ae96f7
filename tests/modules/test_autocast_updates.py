"""Several optimizer steps run inside one `training_step`, i.e. inside one `bf16-mixed` autocast context. An
autocast context opened with its cache (torch's default; on the CPU too in torch 2.13, Lightning's `FSDPPrecision`,
Fabric) keeps its casts of the weights until it exits; Lightning's `MixedPrecision` opens it without. Either way
every forward of the update must read the weights of the latest optimizer step: plain and lean activations, packed
micro-batches, LoRA, PPO's critic, a Lightning fit, and the bf16 sampling copy of the decode path. The detector
(tests/modules/autocast_detector.py) is shown to catch a deliberately stale path."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import pytest
import torch

from rlvr_lightning.core.losses import policy_losses
from rlvr_lightning.generation import sampling_precision
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.sampling_precision import SamplingWeights, _cast_copy
from rlvr_lightning.modules.options import (
    AggregationConfig,
    ImportanceSamplingConfig,
    KLConfig,
    UpdateConfig,
)
from rlvr_lightning.modules.ppo_options import ValueConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.modules.update.value_update import ValueUpdate
from rlvr_lightning.modules.value_model import ValueHead, trainable_copy
from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, LoRAOptions
from tests.modules.autocast_detector import Recorder, autocast_cache_never_cleared, autocast_clears_counted
from tests.packed_rows import RESPONSE_LENGTHS, uneven_rollout

ROWS = 6  # two mini-batches of 3: the second one's forwards run after an optimizer step
PADDED = UpdateConfig(mini_batch_size=3, micro_batch_size=1, max_grad_norm=None)
PACKED = UpdateConfig(mini_batch_size=3, micro_batch_tokens=26, max_grad_norm=None)
SAMPLING = SamplingConfig(max_new_tokens=max(RESPONSE_LENGTHS), temperature=0.9)
# torch < 2.11 hands a cached autocast's no-grad casts to grad-mode forwards (pytorch#112583): a path that never
# clears the cache then trains no cast weight, and nothing goes stale for the detector to see
NO_GRAD_CASTS_REUSED = pytest.mark.skipif(
    torch.__version__ < (2, 11),
    reason="torch < 2.11 reuses no-grad casts in grad mode: a never-cleared path trains no cast weight",
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer

    return save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


class _Module:
    """What `PolicyUpdate.run` asks of the Lightning module, with a real optimizer."""

    def __init__(self, parameters):
        # Adam moves every trained weight by ~lr: far beyond bf16's resolution of the tiny model's weights
        self.optimizer = torch.optim.Adam([p for p in parameters if p.requires_grad], lr=1e-2)
        self.trainer = type("Trainer", (), {"strategy": None})()

    def optimizers(self):
        return self.optimizer

    def lr_schedulers(self):
        return None

    def manual_backward(self, loss):
        loss.backward()


def _policy(tokenizer_dir, device="cpu", model=HFModelOptions(), **kwargs):
    from rlvr_lightning.demos.tiny_lm import tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    return HFPolicy(
        model=dataclasses.replace(model, config=tiny_llama_config(), tokenizer=str(tokenizer_dir)),
        generation=GenerationOptions(share_prompt_prefix=False),
        **kwargs,
    ).to(device)


def _rollout(policy):
    rollout = uneven_rollout(policy.hf_config.vocab_size, seed=0)
    g = torch.Generator().manual_seed(0)
    rollout.advantages = torch.randn(ROWS, generator=g)
    mask = rollout.response_mask
    rollout.values = torch.randn(mask.shape, generator=g) * mask
    rollout.returns = torch.randn(mask.shape, generator=g) * mask
    return rollout.to(policy.device)


def _update(policy, update, critic=None, head=None):
    options = dict(
        policy=policy,
        loss=policy_losses.PPOClip(),
        aggregation=AggregationConfig(mode="token-mean"),
        kl=KLConfig(coef=0.0),
        reference=None,
        rollout_is=ImportanceSamplingConfig(),
        update=update,
        entropy_coef=0.0,
        sampling=SAMPLING,
    )
    if head is None:
        return PolicyUpdate(**options)
    return ValueUpdate(critic, head, ValueConfig(model="separate", clip=0.2), **options)


def _train_under_autocast(update, parameters, rollout):
    """One rollout step's update as `training_step` runs it under `bf16-mixed`: one autocast context."""
    with torch.autocast(rollout.response_ids.device.type, dtype=torch.bfloat16):
        update.add_old_and_reference_log_probs(rollout)
        update.run(rollout, _Module(parameters))


def _policy_path(tokenizer_dir, monkeypatch, device, update_config, **policy_kwargs) -> Recorder:
    policy = _policy(tokenizer_dir, device, **policy_kwargs)
    recorder = Recorder(policy.token_log_probs, [policy], device)
    monkeypatch.setattr(policy, "token_log_probs", recorder)
    _train_under_autocast(_update(policy, update_config), list(policy.parameters()), _rollout(policy))
    return recorder


def _critic_path(tokenizer_dir, monkeypatch, device) -> Recorder:
    policy = _policy(tokenizer_dir, device)
    critic, head = trainable_copy(policy), ValueHead(policy.hidden_size).to(device)
    update = _update(policy, PADDED, critic, head)
    recorder = Recorder(update.values, [critic, head], device)
    monkeypatch.setattr(update, "values", recorder)
    parameters = [*policy.parameters(), *critic.parameters(), *head.parameters()]
    _train_under_autocast(update, parameters, _rollout(policy))
    return recorder


POLICY_PATHS = {
    "plain": dict(update_config=PADDED, model=HFModelOptions(lean_activations=False)),
    "lean": dict(update_config=PADDED, model=HFModelOptions(lean_activations=True)),
    "packed": dict(update_config=PACKED),
    "lora": dict(update_config=PADDED, lora=LoRAOptions(r=4)),
}


def run_path(path, tokenizer_dir, monkeypatch, device="cpu") -> Recorder:
    """Two mini-batches of one update of `path` under bf16 autocast on `device`, its forwards recorded."""
    if path == "critic":
        return _critic_path(tokenizer_dir, monkeypatch, device)
    if path == "lora":
        pytest.importorskip("peft")
    return _policy_path(tokenizer_dir, monkeypatch, device, **POLICY_PATHS[path])


@pytest.mark.parametrize("path", [*POLICY_PATHS, "critic"])
def test_forwards_after_an_optimizer_step_read_the_new_weights(path, tokenizer_dir, monkeypatch):
    recorder = run_path(path, tokenizer_dir, monkeypatch)
    assert recorder.moved_calls(), "no forward ran after an optimizer step: the test would prove nothing"
    assert recorder.stale_calls() == []


@pytest.mark.parametrize("path", [*POLICY_PATHS])
def test_no_grad_casts_are_dropped_before_the_first_training_forward(path, tokenizer_dir, monkeypatch):
    # a cached autocast keeps the casts the no-grad forwards (old log-probs) made, without their gradient, and
    # torch < 2.11 hands them to later grad-mode forwards (pytorch#112583): no weight gradient through them
    with autocast_clears_counted():
        calls = run_path(path, tokenizer_dir, monkeypatch).calls
    pairs = zip(calls, calls[1:], strict=False)
    switches = [(before, after) for before, after in pairs if not before.grad and after.grad]
    assert switches, "no training forward followed a no-grad forward: the test would prove nothing"
    assert all(after.clears > before.clears for before, after in switches)


@NO_GRAD_CASTS_REUSED
@pytest.mark.parametrize("path", [*POLICY_PATHS, "critic"])
def test_the_detector_catches_a_stale_path(path, tokenizer_dir, monkeypatch):
    # the same run with the autocast cache never cleared: the second mini-batch reads the first one's casts
    with autocast_cache_never_cleared():
        recorder = run_path(path, tokenizer_dir, monkeypatch)
    stale = recorder.stale_calls()
    assert stale, "the detector missed a stale path: the test above could not fail"
    assert set(stale) <= set(recorder.moved_calls())  # (a row with an empty response has no log-probs to differ)


def _sampling_copy_path(tokenizer_dir, under_autocast: bool) -> tuple[Recorder, Callable]:
    """A policy trained in fp32 samples from its bf16 copy: a cast copy (`KVCacheGeneration(dtype="bfloat16")`), or
    under bf16 autocast the autocast copy (`dtype: auto` under `bf16-mixed`). The copy's logits before and after an
    optimizer step, replayed with a fresh cast copy (or the model itself under autocast) of the weights of the time."""
    policy = _policy(tokenizer_dir)
    model, copies = policy.model, SamplingWeights()
    ids = torch.randint(10, policy.hf_config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    precision = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if under_autocast else contextlib.nullcontext

    def sample_logits(input_ids):
        with precision():
            return copies.model_for(model, torch.bfloat16)(input_ids=input_ids).logits

    def fresh_logits(input_ids):
        if under_autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                return model(input_ids=input_ids).logits
        return _cast_copy(model, torch.bfloat16)[0](input_ids=input_ids).logits

    recorder = Recorder(sample_logits, [model])
    with torch.no_grad():
        recorder(ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    optimizer.step()
    with torch.no_grad():
        recorder(ids)
    return recorder, fresh_logits


@pytest.mark.parametrize("under_autocast", [False, True], ids=["cast_copy", "autocast_copy"])
def test_the_bf16_sampling_copy_follows_an_optimizer_step(tokenizer_dir, under_autocast):
    recorder, fresh = _sampling_copy_path(tokenizer_dir, under_autocast)
    assert recorder.moved_calls() == [1]
    assert recorder.stale_calls(fresh) == []


@pytest.mark.parametrize("under_autocast", [False, True], ids=["cast_copy", "autocast_copy"])
def test_the_detector_catches_a_sampling_copy_left_stale(tokenizer_dir, monkeypatch, under_autocast):
    monkeypatch.setattr(sampling_precision, "_refresh", lambda *args: None)
    recorder, fresh = _sampling_copy_path(tokenizer_dir, under_autocast)
    assert recorder.moved_calls() == [1]
    assert recorder.stale_calls(fresh) == [1]


def _fit_bf16_mixed(monkeypatch, autocast_cache: bool) -> Recorder:
    """`RLVRModule` fit for one rollout step under Lightning's `bf16-mixed` on the CPU: two mini-batches.
    Lightning's `MixedPrecision` opens autocast without the cache; `autocast_cache`: with it, as Lightning's
    `FSDPPrecision` (and Fabric) open it."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from rlvr_lightning.advantages import AdvantageCallback
    from rlvr_lightning.modules import RLVRModule
    from rlvr_lightning.policies.toy_sort import ToySortPolicy
    from rlvr_lightning.rewards import SortInclusionOrderingReward
    from tests.modules.test_rlvr_module import fit

    class RandomAdvantage(AdvantageCallback):  # a gradient even where a group's rewards are all equal
        def compute(self, rollout):
            return torch.randn(rollout.num_rows)

    if autocast_cache:
        cached = lambda self: torch.autocast(self.device, dtype=torch.bfloat16)  # noqa: E731
        monkeypatch.setattr(MixedPrecision, "autocast_context_manager", cached)
    torch.manual_seed(0)
    # an output layer of its own (an nn.Linear, whose weight autocast casts and caches; the tied one is a view)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4, tie_embeddings=False)
    recorder = Recorder(policy.token_log_probs, [policy])
    monkeypatch.setattr(policy, "token_log_probs", recorder)
    adam = lambda parameters: torch.optim.Adam(parameters, lr=0.05)  # noqa: E731 (moves weights beyond bf16's step)
    module = RLVRModule(policy, adam, group_size=4, update=UpdateConfig(mini_batch_size=8))
    fit(module, [SortInclusionOrderingReward(), RandomAdvantage()], steps=1, batch_size=4, precision="bf16-mixed")
    return recorder


@pytest.mark.parametrize("autocast_cache", [False, True], ids=["lightning_autocast", "cached_autocast"])
def test_lightning_bf16_mixed_training_step_reads_the_new_weights(in_tmp_dir, monkeypatch, autocast_cache):
    recorder = _fit_bf16_mixed(monkeypatch, autocast_cache)
    assert recorder.moved_calls()
    assert recorder.stale_calls() == []


@NO_GRAD_CASTS_REUSED
def test_the_detector_catches_a_stale_lightning_step(in_tmp_dir, monkeypatch):
    with autocast_cache_never_cleared():
        recorder = _fit_bf16_mixed(monkeypatch, autocast_cache=True)
    assert recorder.stale_calls()
