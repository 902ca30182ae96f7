"""The KL reference's refresh (`modules/reference_refresh.py`): when it is due, and ProRL's optimizer reset with it
(`kl.reset_optimizer`): the policy's optimizer state starts again, as at a first step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr_lightning.cli.app import main
from rlvr_lightning.modules.options import KLConfig
from rlvr_lightning.modules.reference_refresh import forget_optimizer_state, refresh_due

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes"


def test_due_every_n_steps_never_before_the_first():
    assert [step for step in range(7) if refresh_due(step, 3)] == [3, 6]
    assert not any(refresh_due(step, None) for step in range(7))


def test_a_forgotten_adam_state_steps_as_at_its_first_step():
    # Adam's first step moves each weight by lr * g / (|g| + eps): the bias-corrected moments are g and g^2
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    other = torch.nn.Parameter(torch.tensor([3.0]))
    optimizer = torch.optim.Adam([param, other], lr=0.1)
    for grad in ([0.5, 0.5], [2.0, -1.0]):
        param.grad, other.grad = torch.tensor(grad), torch.tensor([1.0])
        optimizer.step()
    assert forget_optimizer_state([optimizer], [param]) == 1 and param not in optimizer.state
    assert optimizer.state[other]["step"] == 2  # another module's parameter keeps its state
    before = param.detach().clone()
    param.grad = torch.tensor([0.3, -4.0])
    optimizer.step()
    assert torch.allclose(param.detach() - before, torch.tensor([-0.1, 0.1]), atol=1e-6)
    assert optimizer.state[param]["step"] == 1


def adam_steps(cli) -> set[int]:
    optimizer = cli.trainer.optimizers[0]
    return {int(optimizer.state[p]["step"]) for p in cli.model.policy.parameters() if p in optimizer.state}


@pytest.mark.parametrize("reset, steps", [(False, 6), (True, 2)])
def test_the_refresh_resets_the_policys_optimizer_state_when_asked(reset, steps, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(RECIPES / "grpo.yaml"), "--trainer.limit_train_batches=3"]
    args += ["--trainer.limit_val_batches=0", "--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    args += ["--data.init_args.batch_size=8", "--model.init_args.update.mini_batch_size=32"]
    args += ["--model.init_args.kl.refresh_every=2", f"--model.init_args.kl.reset_optimizer={str(reset).lower()}"]
    cli = main(args)
    # 2 optimizer steps a rollout step; the refresh before the third rollout step resets Adam's step count
    assert adam_steps(cli) == {steps}


def test_a_reset_without_refreshes_is_refused():
    with pytest.raises(
        ValueError,
        match="kl.reset_optimizer resets the optimizer at each reference refresh, but kl.refresh_every is not",
    ):
        KLConfig(coef=0.04, reset_optimizer=True)
