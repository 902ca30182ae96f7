"""The GSM8K GPU recipe and its overlays (configs/gpu/): every overlay parses on top of the recipe, and the
recipe runs end to end on a CPU with each documented GPU setting (bf16-mixed over fp32 weights, 32-true,
gradient checkpointing, attention implementation; FSDP2 with CPU offload on 2 processes), with the model and
the data swapped for a tiny random Llama and a small GSM8K-format file (nothing downloaded); its updates move
the weights, and settings that would train bf16 weights in place are refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning.cli.app import entry_point, main

from .gsm8k_tiny import WeightsAtStart, write_tiny_gsm8k_override

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

RECIPE = ROOT / "configs" / "gsm8k_qwen2.5_math_1.5b.yaml"
OVERLAYS = sorted((ROOT / "configs" / "gpu").glob("*.yaml"))


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[o.stem for o in OVERLAYS])
def test_overlay_parses_on_the_recipe(overlay, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(RECIPE), "--config", str(overlay), "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    policy = config["model"]["init_args"]["policy"]["init_args"]
    task = config["data"]["init_args"]["task"]
    strategy = config["trainer"]["strategy"]
    if overlay.stem.startswith("offline_"):  # weights and data that exist offline
        assert task["class_path"] == "rlvr_lightning.data.JSONLTask" and task["init_args"]["template"] == "r1_zero"
        if "smollm2" in overlay.stem:
            assert policy["model"]["name_or_path"] == "smollm2-135m-instruct"
        else:
            assert policy["model"]["name_or_path"] is None and policy["model"]["config"]["num_hidden_layers"] == 28
    elif overlay.stem == "rollout_servers":  # generation only: the recipe's strategy and precision stay
        assert policy["generation"]["backend"]["class_path"] == "rlvr_lightning.generation.ServerGeneration"
        assert policy["generation"]["backend"]["init_args"]["servers"] == ["localhost:8000"]
    else:
        assert strategy["class_path"] == "rlvr_lightning.parallel.FSDP2Strategy"
        assert strategy["init_args"]["param_dtype"] == "bfloat16"
        assert strategy["init_args"]["cpu_offload"] is (overlay.stem == "cpu_offload")
    # fp32 master weights everywhere: bf16 compute comes from autocast or from FSDP2's param_dtype
    assert policy["model"]["dtype"] == "float32"
    recipe_precision = overlay.stem.startswith("offline_") or overlay.stem == "rollout_servers"
    assert config["trainer"]["precision"] == ("bf16-mixed" if recipe_precision else "32-true")
    comment = "".join(line for line in overlay.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert "Precision:" in comment or "Precision as fsdp2.yaml" in comment


@pytest.fixture(scope="module")
def tiny_override(tmp_path_factory) -> Path:
    return write_tiny_gsm8k_override(tmp_path_factory.mktemp("gsm8k_tiny"), accelerator="cpu")


SETTINGS = {  # the GPU settings of docs/scaling.md, as command-line overrides of the recipe
    "recipe (fp32 weights, bf16-mixed, gradient checkpointing, sdpa)": [],
    "32-true": ["--trainer.precision=32-true"],
    "eager attention, no checkpointing": [
        "--model.init_args.policy.init_args.model.attn_implementation=eager",
        "--model.init_args.policy.init_args.model.gradient_checkpointing=false",
    ],
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_recipe_runs_on_cpu_with_each_setting(setting, tiny_override, in_tmp_dir):
    cli = main(
        [
            "fit",
            "--config",
            str(RECIPE),
            "--config",
            str(tiny_override),
            *SETTINGS[setting],
            "--trainer.callbacks+=tests.gsm8k_tiny.WeightsAtStart",
            "--trainer.callbacks+=tests.gsm8k_tiny.EvenTokenReward",
        ]
    )
    start = next(cb for cb in cli.trainer.callbacks if isinstance(cb, WeightsAtStart))
    assert cli.trainer.global_step == 2  # one rollout of 2 x 4 responses, mini-batches of 4
    assert "train/reward_mean" in cli.trainer.callback_metrics and "val/accuracy" in cli.trainer.callback_metrics
    policy = cli.model.policy
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert cli.trainer.precision == ("32-true" if setting == "32-true" else "bf16-mixed")
    # the two AdamW steps at lr 1e-6 moved nearly every weight that had a gradient (bf16 weights: ~2%)
    moved = sum(int((p.detach() != w).sum()) for p, w in zip(policy.parameters(), start.weights, strict=True))
    assert moved / sum(w.numel() for w in start.weights) > 0.5
    assert policy.model.config._attn_implementation == ("eager" if "eager" in setting else "sdpa")
    model = policy.model  # transformers 5.2x renamed is_gradient_checkpointing (the old name warns)
    checkpointing = getattr(type(model), "is_activation_checkpointing", None) and model.is_activation_checkpointing
    if checkpointing is None:
        checkpointing = model.is_gradient_checkpointing
    assert checkpointing is ("no checkpointing" not in setting)


@pytest.mark.parametrize(
    "override", ["--model.init_args.policy.init_args.model.dtype=bfloat16", "--trainer.precision=bf16-true"]
)
def test_recipe_refuses_to_train_bf16_weights_in_place(override, tiny_override, in_tmp_dir, capsys):
    status = entry_point(["fit", "--config", str(RECIPE), "--config", str(tiny_override), override])
    error = capsys.readouterr().err
    assert status == 2 and "Traceback" not in error  # a configuration mistake, said in a few lines
    assert "torch.bfloat16" in error and "Keep fp32 master weights" in error and "bf16-mixed" in error
    assert ("dtype: float32" in error) if "dtype" in override else ("trainer.precision='bf16-true'" in error)


def test_recipe_runs_sharded_with_cpu_offload_on_two_processes(tiny_override, tmp_path):
    """fsdp2.yaml + cpu_offload.yaml (bf16 compute, fp32 reduction, offloaded shards) on 2 CPU processes."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    for name in ("MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"):  # launch a fresh job, not join one
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "rlvr_lightning.cli",
        "fit",
        "--config",
        str(RECIPE),
        "--config",
        str(tiny_override),
    ]
    for overlay in ("fsdp2", "cpu_offload"):
        command += ["--config", str(ROOT / "configs" / "gpu" / f"{overlay}.yaml")]
    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path)}}
    command += [
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger={json.dumps(logger)}",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = (next(tmp_path.rglob("metrics.csv"))).read_text()
    assert "train/reward_mean" in rows and "train/grad_norm" in rows and "val/accuracy" in rows
