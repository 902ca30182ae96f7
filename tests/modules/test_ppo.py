"""`PPOModule`: GAE advantages from the critic, the value loss and its clipping, critic warm-up, the two
value-model forms, per-token KL rewards, exact micro-batching, and the options' errors."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.testing import assert_close

from rlvr_lightning.advantages import CenteredAdvantage
from rlvr_lightning.core.masked import masked_normalize
from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import PPOModule
from rlvr_lightning.modules.options import KLConfig, UpdateConfig
from rlvr_lightning.modules.ppo_options import GAEConfig, ValueConfig
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import RewardCallback, SortAndStopReward, SortInclusionOrderingReward

ROOT = Path(__file__).resolve().parents[2]


class Recorder(pl.Callback):
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items()})


class ConstantReward(RewardCallback):
    def score(self, rollout):
        return torch.ones(rollout.num_rows)


def fit(module, callbacks, steps=2, batch_size=4, task=None):
    pl.seed_everything(0)
    data = RLVRDataModule(task or SortTask(vocab_size=5, length=3, num_val=0), batch_size=batch_size)
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
    trainer.fit(module, data)
    return recorder


def toy(seed=0):
    torch.manual_seed(seed)
    return ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4, activation="tanh")


def parameters(module):
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize("value_model", ["separate", "shared"])
def test_first_step_advantages_are_the_whitened_returns_of_a_zero_critic(value_model):
    # the value head starts at 0: with gamma = lam = 1 every token's return is its response's reward
    module = PPOModule(toy(), group_size=4, value=ValueConfig(model=value_model))
    recorder = fit(module, [SortInclusionOrderingReward()], steps=1)
    rollout = module.last_rollout
    assert torch.equal(rollout.values, torch.zeros_like(rollout.values))
    returns = rollout.reward.unsqueeze(1).expand_as(rollout.returns)
    assert_close(rollout.returns, returns)
    assert_close(rollout.advantages, masked_normalize(returns, rollout.response_mask))
    metrics = recorder.steps[-1]
    for key in ("value_loss", "clip_frac", "grad_norm", "values_mean", "returns_mean", "explained_variance", "warmup"):
        assert f"train/critic/{key}" in metrics, key
    # the first value loss is 1/2 mean_t (0 - R_t)^2 over the tokens (values can only be clipped after they move)
    assert metrics["train/critic/value_loss"] == pytest.approx(0.5 * float((returns**2).mean()), rel=1e-5)
    assert metrics["train/critic/clip_frac"] == 0.0


def test_discounted_returns_from_a_zero_critic():
    module = PPOModule(toy(), group_size=4, gae=GAEConfig(gamma=0.5, lam=1.0, whiten=False))
    fit(module, [SortInclusionOrderingReward()], steps=1)
    rollout = module.last_rollout
    # 3 response tokens: R_t = 0.5^(2 - t) * reward, and unwhitened advantages equal returns (V = 0)
    expected = rollout.reward.unsqueeze(1) * torch.tensor([0.25, 0.5, 1.0])
    assert_close(rollout.returns, expected)
    assert_close(rollout.advantages, expected)


def test_decoupled_and_length_adaptive_lambdas():
    # VC-PPO: the critic's targets from lam_critic, the advantages from lam; VAPO: a lam per response from its length
    from rlvr_lightning.core.gae import gae_advantages, length_adaptive_lambda, outcome_token_rewards

    gae = GAEConfig(gamma=1.0, lam=0.5, lam_critic=1.0, whiten=False, length_adaptive_alpha=0.5)
    module = PPOModule(
        toy(), group_size=4, optimizer=lambda params: torch.optim.Adam(params, lr=0.05), gae=gae
    )  # fmt: skip
    fit(module, [SortInclusionOrderingReward()], steps=2)
    rollout = module.last_rollout
    assert rollout.values.abs().max() > 0  # the critic moved after the first step
    rewards = outcome_token_rewards(rollout.reward, rollout.response_mask)
    lam = length_adaptive_lambda(rollout.response_mask.sum(-1), 0.5)  # 3 tokens: 1 - 1/1.5
    assert_close(lam, torch.full((16,), 1 / 3))
    expected, _ = gae_advantages(rewards, rollout.values, rollout.response_mask, 1.0, lam)
    _, targets = gae_advantages(rewards, rollout.values, rollout.response_mask, 1.0, 1.0)
    assert_close(rollout.advantages, expected)
    assert_close(rollout.returns, targets)
    assert not torch.allclose(rollout.returns, expected + rollout.values)  # not the advantages' own returns


@pytest.mark.parametrize("value_model", ["separate", "shared"])
def test_warm_up_trains_the_critic_only(value_model):
    module = PPOModule(toy(), group_size=4, value=ValueConfig(model=value_model, warmup_steps=2, lr=0.05))
    policy_before = parameters(module.policy)
    recorder = fit(module, [SortInclusionOrderingReward()], steps=2)
    assert all(torch.equal(a, b) for a, b in zip(policy_before, parameters(module.policy), strict=True))
    assert module.value_head.linear.weight.abs().sum() > 0
    assert [s["train/critic/warmup"] for s in recorder.steps] == [1.0, 1.0]
    assert recorder.steps[-1]["train/grad_norm"] == 0.0  # the policy got no gradient at all
    # the third step is past the warm-up: the policy moves
    module = PPOModule(toy(), group_size=4, value=ValueConfig(model=value_model, warmup_steps=2, lr=0.05))
    recorder = fit(module, [SortInclusionOrderingReward()], steps=3)
    assert recorder.steps[-1]["train/critic/warmup"] == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(policy_before, parameters(module.policy), strict=True))


def test_the_critic_learns_the_returns():
    module = PPOModule(toy(), group_size=4, value=ValueConfig(lr=0.05, coef=1.0, clip=None))
    recorder = fit(module, [ConstantReward()], steps=30)
    # every return is 1: the values go from 0 to 1, the value loss from 1/2 to ~0
    assert recorder.steps[0]["train/critic/value_loss"] == pytest.approx(0.5)
    assert recorder.steps[-1]["train/critic/values_mean"] == pytest.approx(1.0, abs=0.1)
    assert recorder.steps[-1]["train/critic/value_loss"] < 0.01


@pytest.mark.parametrize("value_model", ["separate", "shared"])
@pytest.mark.parametrize("warming_up", [False, True])
def test_the_value_loss_reaches_the_policy_trunk_only_when_shared(value_model, warming_up):
    # advantages 0: the policy loss has no gradient, so whatever reaches the policy comes from the value loss
    module = PPOModule(toy(), group_size=4, value=ValueConfig(model=value_model, coef=1.0, clip=None))
    module.policy_update.warming_up = warming_up  # as on_train_batch_start sets it
    torch.nn.init.normal_(module.value_head.linear.weight)
    rollout = module.policy.sample({"prompt": [[1, 0, 2], [4, 3, 3]]}, 4, SamplingConfig())
    rollout.old_log_probs = None
    rollout.advantages = torch.zeros(8)
    rollout.values, rollout.returns = torch.zeros(8, 3), torch.ones(8, 3)
    part = module.policy_update.micro_batch_loss(rollout, None, MiniBatchSizes(8, 24), first_epoch=True)
    part.loss.backward()
    policy_grad = sum(float(p.grad.abs().sum()) for p in module.policy.parameters() if p.grad is not None)
    critic_grad = sum(float(p.grad.abs().sum()) for p in module.critic_parameters() if p.grad is not None)
    assert critic_grad > 0
    assert (policy_grad > 0) == (value_model == "shared" and not warming_up)
    # the loss is vf_coef * the token-mean value loss 1/2 (V - 1)^2 (the policy loss is 0)
    values = module.policy_update.values(rollout).detach()
    assert_close(part.loss.detach(), 0.5 * ((values - 1) ** 2).mean())


def test_each_model_is_clipped_on_its_own():
    module = PPOModule(toy(), group_size=4, update=UpdateConfig(max_grad_norm=1.0))
    for params, norm in ((list(module.policy.parameters()), 3.0), (module.critic_parameters(), 4.0)):
        for p in params:
            p.grad = torch.zeros_like(p)
        params[0].grad.view(-1)[0] = norm
    module.policy_update.clip_gradients(module, None)
    policy_norm = torch.linalg.vector_norm(torch.cat([p.grad.view(-1) for p in module.policy.parameters()]))
    critic_norm = torch.linalg.vector_norm(torch.cat([p.grad.view(-1) for p in module.critic_parameters()]))
    # one joint norm of 5 would leave 0.6 and 0.8
    assert_close((policy_norm, critic_norm), (torch.tensor(1.0), torch.tensor(1.0)))


def test_a_non_finite_critic_gradient_skips_the_update():
    module = PPOModule(toy(), group_size=4)
    module.policy_update._critic_grad_norms = []
    for p in [*module.policy.parameters(), *module.critic_parameters()]:
        p.grad = torch.ones_like(p)
    assert torch.isfinite(module.policy_update.gradient_norm(torch.device("cpu")))
    module.value_head.linear.bias.grad.fill_(float("inf"))
    assert not torch.isfinite(module.policy_update.gradient_norm(torch.device("cpu")))


def test_warm_up_gradient_norms_are_on_the_loss_device():
    # the policy has no gradient during the warm-up: its norm is a 0 made on the loss's device (meta stands for the
    # GPU), not a CPU 0 that the loss would be stacked with
    module = PPOModule(toy(), group_size=4, value=ValueConfig(warmup_steps=1))
    module.policy_update._critic_grad_norms = []
    for p in module.critic_parameters():
        p.grad = torch.ones_like(p)
    meta = torch.device("meta")
    assert module.policy_update.gradient_norm(meta).device == meta
    assert module.policy_update._critic_grad_norms[0].device == meta


def test_critic_learning_rate_is_its_parameter_group():
    module = PPOModule(
        toy(), group_size=4, optimizer=lambda params: torch.optim.Adam(params, lr=0.003), value=ValueConfig(lr=0.01)
    )
    optimizer = module.configure_optimizers()
    policy_group, critic_group = optimizer.param_groups
    assert policy_group["lr"] == 0.003 and critic_group["lr"] == 0.01
    assert {id(p) for p in critic_group["params"]} == {id(p) for p in module.critic_parameters()}
    assert len(critic_group["params"]) == len(list(module.critic.parameters())) + 2  # trunk + head weight and bias


def test_kl_in_the_reward_is_charged_per_token():
    # kl_mode=reward: every token's reward is -kl_coef * KL_t and the last one's adds the task reward, so with
    # gamma = lam = 1 the return at t is the reward minus kl_coef times the KL still to come
    module = PPOModule(
        toy(),
        group_size=4,
        optimizer=lambda params: torch.optim.Adam(params, lr=0.05),
        kl=KLConfig(coef=0.5, estimator="k1", mode="reward"),
        update=UpdateConfig(epochs=2),
        gae=GAEConfig(whiten=False),
    )
    recorder = fit(module, [SortInclusionOrderingReward()], steps=3)
    rollout = module.last_rollout
    kl = rollout.old_log_probs - rollout.ref_log_probs  # k1 at the sampling policy
    assert kl.abs().max() > 1e-3  # the policy has moved off its reference
    to_come = kl.flip(-1).cumsum(-1).flip(-1)
    assert_close(rollout.returns, rollout.reward.unsqueeze(1) - 0.5 * to_come)
    assert recorder.steps[-1]["train/kl_reward_penalty"] == pytest.approx(float((0.5 * kl.sum(-1)).mean()), rel=1e-5)


def test_micro_batches_accumulate_to_the_mini_batch_update():
    def run(micro):
        module = PPOModule(
            toy(),
            group_size=4,
            update=UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=micro),
            value=ValueConfig(lr=0.01),
        )
        fit(module, [SortInclusionOrderingReward()], steps=2)
        return parameters(module)

    for a, b in zip(run(None), run(2), strict=True):
        assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_an_advantage_callback_is_an_error():
    with pytest.raises(
        ValueError, match="PPOModule estimates advantages with GAE from its critic; remove CenteredAdvantage"
    ):
        fit(PPOModule(toy(), group_size=4), [SortInclusionOrderingReward(), CenteredAdvantage()])


class NoCopyPolicy(ToySortPolicy):
    def create_reference(self):
        return nn.Module()  # what a LoRA policy's reference is: no weights of its own


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (lambda: dict(value=ValueConfig(model="both")), "value.model='both' is not valid; choose one of"),
        (
            lambda: dict(value=ValueConfig(model="shared"), critic=ToySortPolicy(vocab_size=5, prompt_length=3)),
            "value.model='shared' reads the policy's own",
        ),
        (lambda: dict(gae=GAEConfig(gamma=1.5)), r"gae.gamma=1.5 is not valid: must be a finite number in \[0, 1\]"),
        (lambda: dict(value=ValueConfig(coef=0.0)), "value.coef=0.0 is not valid: must be a finite number > 0"),
        (
            lambda: dict(value=ValueConfig(clip=-1.0)),
            r"value.clip=-1.0 is not valid: must be a finite number > 0 \(or null\)",
        ),
        (
            lambda: dict(value=ValueConfig(warmup_steps=-1)),
            "value.warmup_steps=-1 is not valid: must be an integer >= 0",
        ),
    ],
)
def test_bad_options_fail_with_the_option_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOModule(toy(), group_size=4, **kwargs())


def test_a_policy_without_a_copy_needs_a_critic():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="pass a `critic` model, or use value_model='shared'"):
        PPOModule(NoCopyPolicy(vocab_size=5, prompt_length=3), group_size=4)
    critic = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=6)
    module = PPOModule(NoCopyPolicy(vocab_size=5, prompt_length=3), group_size=4, critic=critic)
    assert module.critic is critic and module.value_head.linear.in_features == 6


@pytest.mark.parametrize("value_model", ["separate", "shared"])
def test_ppo_on_a_tiny_language_model(value_model):
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(
            config={
                "model_type": "llama",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 32,
            },
            tokenizer=str(ROOT / "configs" / "length_bias" / "digits_tokenizer"),
        ),
        prompt=PromptOptions(template="raw"),
    )
    module = PPOModule(
        policy, group_size=4, sampling=SamplingConfig(max_new_tokens=6), value=ValueConfig(model=value_model, lr=0.01)
    )
    recorder = fit(module, [SortAndStopReward(stop="any")], steps=2, task=SortTask(vocab_size=10, length=3, num_val=0))
    rollout = module.last_rollout
    mask = rollout.response_mask.bool()
    assert (rollout.values[~mask] == 0).all() and (rollout.returns[~mask] == 0).all()
    assert all(torch.isfinite(torch.tensor(v)) for k, v in recorder.steps[-1].items() if k.startswith("train/critic"))
    if value_model == "separate":
        assert isinstance(module.critic, HFPolicy) and module.critic.model is not policy.model
        assert module.critic.tokenizer is policy.tokenizer  # the copy shares the tokenizer, not the weights
