"""Callbacks with state of their own resume bitwise: A*-PO's V* per prompt (`OptimalValueAdvantage`), Skywork-OR1's
entropy coefficient (`AdaptiveEntropyControl`), DCPO's reward statistics per prompt (`SmoothStandardizedAdvantage`)
and SPO's trackers, kept responses and sampled prompts (`ValueTrackerAdvantage`, also drawing its prompts by the
trackers; these over a pool of 24 prompts, so that the second epoch brings every prompt back), and the averaged weights
of `BEMA` (on Dr. GRPO's recipe, the reference following them). Each recipe runs 2
epochs of 3 rollout steps; a run resumed from the checkpoint of the first epoch's end ends where the uninterrupted
run ends, with every logged step equal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning.advantages import OptimalValueAdvantage, SmoothStandardizedAdvantage, ValueTrackerAdvantage
from rlvr_lightning.callbacks import BEMA, AdaptiveEntropyControl
from rlvr_lightning.cli.app import main
from tests.test_resume import logged, parameters

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "recipes"
SIZES = {"astar_po": (32, 16), "adaptive_entropy": (8, 32), "dcpo": (8, 16), "spo": (8, 4), "grpo": (8, 32)}
POOLS = {"dcpo": 24, "spo": 24}  # a finite training set: 3 steps an epoch


def run(tmp_path: Path, recipe: str, name: str, *extra: str):
    prioritized = recipe == "spo_prioritized"  # SPO drawing 4 of each batch's 8 prompts by their trackers
    averaged = recipe == "grpo_bema"  # BEMA after one step of burn-in, every second step, as the reference
    recipe = "spo" if prioritized else "grpo" if averaged else recipe
    config = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())
    trainer, model = config["trainer"], config["model"]["init_args"]
    prompts, mini_batch = SIZES[recipe]
    config["data"]["init_args"]["batch_size"] = prompts
    if recipe in POOLS:
        config["data"]["init_args"]["task"]["init_args"]["num_train"] = POOLS[recipe]
    model["update"]["mini_batch_size"] = mini_batch
    if averaged:
        model["kl"]["refresh_every"] = None
        bema = {"update_after": 1, "update_freq": 2, "update_reference": True}
        trainer["callbacks"].append({"class_path": "rlvr_lightning.callbacks.BEMA", "init_args": bema})
    for callback in trainer["callbacks"]:
        if callback["class_path"].endswith("AdaptiveEntropyControl"):
            callback["init_args"]["target"] = 5.0  # above the entropy: the bonus is on, its coefficient rises
        if prioritized and callback["class_path"].endswith("ValueTrackerAdvantage"):
            callback["init_args"]["prioritize"] = 4
    trainer["callbacks"].append(
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {
                "dirpath": str(tmp_path / f"ckpt_{name}"),
                "every_n_epochs": 1,
                "save_on_train_epoch_end": True,
                "save_top_k": -1,
                "filename": "{epoch}",
            },
        }
    )
    trainer.update(
        max_epochs=2,
        limit_train_batches=3,
        limit_val_batches=0,
        val_check_interval=None,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger={
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(tmp_path / "logs"), "name": name},
        },
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["fit", "--config", str(path), *extra])


def controller(cli, kind):
    return next(c for c in cli.trainer.callbacks if isinstance(c, kind))


@pytest.mark.parametrize(
    ("recipe", "kind", "state"),
    [
        ("astar_po", OptimalValueAdvantage, lambda c: c.values),
        ("adaptive_entropy", AdaptiveEntropyControl, lambda c: (c.coef, c.enabled)),
        ("dcpo", SmoothStandardizedAdvantage, lambda c: c.stats),
        (
            "spo",
            ValueTrackerAdvantage,
            lambda c: (c.trackers, c.primed, {k: r["log_probs"].tolist() for k, r in c.last.items()}),
        ),
        ("spo_prioritized", ValueTrackerAdvantage, lambda c: (c.trackers, c.primed, c.keys)),
        (
            "grpo_bema",
            BEMA,
            lambda c: (c.step, [[t.tolist() for t in getattr(c, k)] for k in ("theta0", "ema", "bema")]),
        ),
    ],
)
def test_resume_is_bitwise(recipe, kind, state, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full = run(tmp_path, recipe, "full")
    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = run(tmp_path, recipe, "resumed", "--ckpt_path", "last")
    assert resumed.trainer.fit_loop.epoch_loop._batches_that_stepped == 6
    assert state(controller(resumed, kind)) == state(controller(full, kind))
    for key, value in parameters(full.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    for key in ("train/reward_mean", "train/loss"):
        full_log, resumed_log = logged(tmp_path, "full", key), logged(tmp_path, "resumed", key)
        assert sorted(resumed_log) == [3, 4, 5]
        assert resumed_log == {step: full_log[step] for step in resumed_log}
    if recipe == "adaptive_entropy":
        coefs = logged(tmp_path, "resumed", "train/entropy_coef")
        assert coefs == {step: logged(tmp_path, "full", "train/entropy_coef")[step] for step in coefs}
        assert float(coefs[5]) > 0
