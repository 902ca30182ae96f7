"""BEMA (Block and Zhang 2025, arXiv:2508.00180): the update by hand and equal to TRL's BEMACallback restated; in a
fit, validation with the averaged weights, the reference following them, the averaged policy saved, bad options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from rlvr_lightning.callbacks import BEMA
from rlvr_lightning.cli.app import main
from rlvr_lightning.core.bema import bema_coefficients, bema_update_

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes"


def test_two_updates_by_hand():
    # theta_0 = 0, then iterates 1 and 2; lag 10, multiplier 1, kappa 0.5, eta 0.2
    theta0, ema, bema = [torch.zeros(1, dtype=torch.float64) for _ in range(3)]
    alpha, beta = bema_coefficients(1, lag=10, multiplier=1, ema_power=0.5, bias_power=0.2)
    assert (alpha, beta) == pytest.approx((11**-0.2, 11**-0.5))
    bema_update_([torch.ones(1)], [theta0], [ema], [bema], alpha, beta)
    # EMA_1 = 0.301511 * 1; BEMA_1 = 0.301511 + 0.619044 * (1 - 0)
    assert (ema.item(), bema.item()) == pytest.approx((0.3015113446, 0.9205552653))
    alpha, beta = bema_coefficients(2, lag=10, multiplier=1, ema_power=0.5, bias_power=0.2)
    bema_update_([torch.full((1,), 2.0)], [theta0], [ema], [bema], alpha, beta)
    # EMA_2 = (1 - 0.288675) * 0.301511 + 0.288675 * 2 = 0.791823; BEMA_2 = 0.791823 + 0.608364 * 2
    assert (ema.item(), bema.item()) == pytest.approx((0.7918227858, 2.0085514696))
    # the EMA rate's floor
    assert bema_coefficients(10**6, 10, 1, 0.5, 0.2, min_ema_multiplier=0.01)[1] == 0.01


class TRLBEMA:
    """TRL's `BEMACallback` (huggingface/trl f2cd577, trl/trainer/callbacks.py) restated: `on_train_begin` clones
    theta_0 and the EMA, `on_step_end` snapshots at `update_after` and updates every `update_freq` steps after."""

    def __init__(self, params, update_freq, ema_power, bias_power, lag, update_after, multiplier, min_ema_multiplier):
        self.update_freq, self.ema_power, self.bias_power, self.lag = update_freq, ema_power, bias_power, lag
        self.update_after, self.multiplier, self.min_ema_multiplier = update_after, multiplier, min_ema_multiplier
        self.theta0 = [p.clone() for p in params]
        self.ema = [p.clone() for p in params]
        self.running = [p.clone() for p in params]

    def on_step_end(self, step, params):
        if step < self.update_after:
            return
        if step == self.update_after:
            for p, theta0, ema in zip(params, self.theta0, self.ema, strict=True):
                theta0.copy_(p)
                ema.copy_(p)
        elif (step - self.update_after) % self.update_freq == 0:
            beta = max((self.lag + self.multiplier * step) ** (-self.ema_power), self.min_ema_multiplier)
            alpha = (self.lag + self.multiplier * step) ** (-self.bias_power)
            for p, theta0, ema, run in zip(params, self.theta0, self.ema, self.running, strict=True):
                ema.mul_(1 - beta).add_(p, alpha=beta)
                run.copy_(ema + alpha * (p - theta0))


@pytest.mark.parametrize(
    "options",
    [
        dict(update_freq=1, ema_power=0.5, bias_power=0.2, lag=10, update_after=0, multiplier=1.0),
        dict(update_freq=3, ema_power=0.3, bias_power=0.7, lag=2, update_after=4, multiplier=0.5),
        dict(update_freq=2, ema_power=0.0, bias_power=8.0, lag=1, update_after=1, multiplier=2.0),
    ],
)
def test_equal_to_trls_callback_on_a_random_trajectory(options):
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    trl = TRLBEMA([p.detach() for p in model.parameters()], min_ema_multiplier=0.05, **options)
    ours = BEMA(min_ema_multiplier=0.05, validate=False, **options)
    module = torch.nn.Module()
    module.policy = model
    ours.on_fit_start(None, module)
    for step in range(1, 20):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
        trl.on_step_end(step, [p.detach() for p in model.parameters()])
        ours.on_train_batch_end(None, module, None, None, step - 1)
        since = step - options["update_after"]
        if since >= options["update_freq"]:  # TRL's running model is written by the first update, not the snapshot
            for expected, averaged in zip(trl.running, ours.bema, strict=True):
                assert torch.allclose(averaged.double(), expected, atol=1e-6)
            for expected, averaged in zip(trl.ema, ours.ema, strict=True):
                assert torch.allclose(averaged.double(), expected, atol=1e-6)


def fit(tmp_path, recipe, bema, *extra, steps=3):
    config = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())
    config["trainer"]["callbacks"].append({"class_path": "rlvr_lightning.callbacks.BEMA", "init_args": bema})
    path = tmp_path / f"{recipe}_bema.yaml"
    path.write_text(yaml.safe_dump(config))
    quick = [f"--trainer.limit_train_batches={steps}", "--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    quick += [f"--trainer.default_root_dir={tmp_path}", "--data.init_args.batch_size=8"]
    quick += ["--model.init_args.update.mini_batch_size=32", "--trainer.enable_progress_bar=false"]
    return main(["fit", "--config", str(path), *quick, *extra])


class Probe(Callback):
    """Records the policy's weights as validation sees them, and after."""

    seen: list = []

    def on_validation_epoch_start(self, trainer, pl_module):
        Probe.seen.append([p.detach().clone() for p in pl_module.policy.parameters() if p.requires_grad])


def test_validation_answers_with_the_averaged_weights_and_training_goes_on_with_the_live_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Probe.seen = []
    probe = ["--trainer.callbacks+=tests.callbacks.test_bema.Probe", "--trainer.val_check_interval=3"]
    cli = fit(tmp_path, "dr_grpo", {"update_freq": 1}, *probe, "--trainer.num_sanity_val_steps=0")
    bema = next(c for c in cli.trainer.callbacks if isinstance(c, BEMA))
    assert bema.step == 3 and len(Probe.seen) == 1  # validated once, after the third step
    live = [p.detach() for p in cli.model.policy.parameters() if p.requires_grad]
    for validated, averaged, current in zip(Probe.seen[0], bema.bema, live, strict=True):
        assert torch.equal(validated, averaged.to(validated.dtype))
        assert not torch.equal(current, validated)  # the live weights came back after validation
    assert bema.theta0 and not torch.equal(bema.theta0[0], bema.bema[0])


def test_the_reference_follows_the_averaged_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = fit(tmp_path, "grpo", {"update_reference": True}, "--model.init_args.kl.refresh_every=null")
    bema = next(c for c in cli.trainer.callbacks if isinstance(c, BEMA))
    trainable = [name for name, p in cli.model.policy.named_parameters() if p.requires_grad]
    reference = dict(cli.model.reference.named_parameters())
    for name, averaged in zip(trainable, bema.bema, strict=True):
        assert torch.equal(reference[name], averaged.to(reference[name].dtype)), name


def test_contradictory_options_fail_at_start_up(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="BEMA.update_reference and kl.refresh_every=50 both set the KL reference"):
        fit(tmp_path, "grpo", {"update_reference": True})
    with pytest.raises(ValueError, match="BEMA.update_reference sets the KL reference, but the module keeps none"):
        fit(tmp_path, "dr_grpo", {"update_reference": True})
    with pytest.raises(ValueError, match="BEMA.save_to saves with Policy.save_pretrained, which ToySortPolicy lacks"):
        fit(tmp_path, "dr_grpo", {"save_to": str(tmp_path / "bema")})
    with pytest.raises(ValueError, match=r"ema_power.*-0\.5"):
        BEMA(ema_power=-0.5)
    with pytest.raises(ValueError, match=r"update_freq.*0"):
        BEMA(update_freq=0)


def fit_language_model(tmp_path, bema: dict, **model_options):
    """Two steps of the length-bias config's tiny Llama with `BEMA(**bema)` (and model options set as given)."""
    length_bias = RECIPES.parent / "length_bias"
    config = yaml.safe_load((length_bias / "grpo.yaml").read_text())
    policy = config["model"]["init_args"]["policy"]["init_args"]
    policy["model"]["tokenizer"] = str(length_bias / "digits_tokenizer")
    policy.update(model_options.pop("policy", {}))
    config["model"]["init_args"].update(model_options)
    config["trainer"]["callbacks"].append({"class_path": "rlvr_lightning.callbacks.BEMA", "init_args": bema})
    path = tmp_path / "bema_lm.yaml"
    path.write_text(yaml.safe_dump(config))
    quick = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    quick += ["--trainer.enable_checkpointing=false", "--data.init_args.batch_size=8"]
    return main(["fit", "--config", str(path), *quick, "--model.update.mini_batch_size=32"])


def test_the_averaged_policy_is_saved_at_the_end_of_fit(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    saved = tmp_path / "bema_policy"
    cli = fit_language_model(tmp_path, {"save_to": str(saved), "validate": False})
    bema = next(c for c in cli.trainer.callbacks if isinstance(c, BEMA))
    loaded = dict(AutoModelForCausalLM.from_pretrained(saved).named_parameters())
    trainable = [name for name, p in cli.model.policy.named_parameters() if p.requires_grad]
    live = dict(cli.model.policy.named_parameters())
    for name, averaged in zip(trainable, bema.bema, strict=True):
        key = name.removeprefix("model.")
        assert torch.equal(loaded[key], averaged.to(loaded[key].dtype)), name
        assert not torch.equal(live[name].detach(), loaded[key])  # the live policy keeps its own weights


def test_a_lora_policys_adapter_reference_follows_the_averaged_adapters(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.chdir(tmp_path)
    bema = {"update_reference": True, "validate": False}
    cli = fit_language_model(tmp_path, bema, policy={"lora": {"r": 4, "alpha": 8}}, kl={"coef": 0.04})
    bema = next(c for c in cli.trainer.callbacks if isinstance(c, BEMA))
    trainable = [name for name, p in cli.model.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in name for name in trainable)
    # scoring as the reference is scoring with the averaged adapters
    rollout = cli.model.last_rollout
    reference = cli.model.policy.reference_log_probs(cli.model.reference, rollout, 1.0)
    with bema.averaged(cli.model):
        averaged, _ = cli.model.policy.token_log_probs(rollout, temperature=1.0)
    live, _ = cli.model.policy.token_log_probs(rollout, temperature=1.0)
    mask = rollout.response_mask.bool()
    assert torch.allclose(reference[mask], averaged[mask], atol=1e-6)
    assert not torch.allclose(reference[mask], live[mask], atol=1e-6)
