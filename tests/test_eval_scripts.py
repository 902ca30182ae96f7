"""The scripts that use `rlvr eval`: eval_arithmetic.py's command lines and a run on a tiny Llama;
plot_reasoning_gym_run.py reads its reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from rlvr_lightning.demos.named_digit import fit_config, save_word_tokenizer
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


def options(**overrides) -> argparse.Namespace:
    values = dict(
        config=str(REPO / "configs" / "smollm2_arithmetic.yaml"), ckpt=None, num=200, temperature=1.0, samples=1,
        max_new_tokens=None, batch_size=50, threads=1, seed=0, no_tools=False, overrides=[],
    )  # fmt: skip
    return argparse.Namespace(**{**values, **overrides})


def value_of(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def batches(argv: list[str]) -> tuple[int, int]:
    """(problems per batch, batches) of an `rlvr eval` command line."""
    return int(value_of(argv, "--data.init_args.val_batch_size")), int(value_of(argv, "--trainer.limit_val_batches"))


def test_the_command_lines_of_each_mode():
    script = load_script("eval_arithmetic")
    greedy = script.eval_args(options(ckpt="run.ckpt"), "greedy", Path("out.json"), "root")
    assert value_of(greedy, "--ckpt_path") == "run.ckpt" and value_of(greedy, "--eval.greedy") == "true"
    assert batches(greedy) == (50, 4)
    # the recipe starts from the warm-up's checkpoint: its inner policy is evaluated (with --ckpt's weights)
    recipe = yaml.safe_load((REPO / "configs" / "smollm2_arithmetic.yaml").read_text())
    assert (
        json.loads(value_of(greedy, "--model.init_args.policy"))
        == recipe["model"]["init_args"]["policy"]["init_args"]["policy"]
    )
    sampled = script.eval_args(options(num=30, samples=4, temperature=0.7), "temperature", Path("o.json"), "root")
    assert [value_of(sampled, f"--eval.{name}") for name in ("greedy", "samples", "temperature")] == [
        "false",
        "4",
        "0.7",
    ]
    assert batches(sampled) == (30, 1)
    calculator = options(
        config=str(REPO / "configs" / "smollm2_calculator.yaml"), no_tools=True, num=100, batch_size=40
    )
    no_tools = script.eval_args(calculator, "greedy", Path("o.json"), "root")
    policy = json.loads(value_of(no_tools, "--model.init_args.policy"))
    assert (
        policy["class_path"] == "rlvr_lightning.policies.HFPolicy"
        and policy["init_args"]["generation"]["tools"] is None
    )
    assert batches(no_tools) == (25, 4)  # the largest divisor of 100 up to 40


def test_options_after_a_double_dash_go_to_rlvr_eval(monkeypatch):
    script = load_script("eval_arithmetic")
    seen = {}
    monkeypatch.setattr(script, "cmd_eval", lambda args: seen.update(vars(args)))
    task = ["--data.init_args.task.init_args.min_digits", "1", "--data.init_args.task.init_args.digits", "3"]
    script.main(["eval", "--config", "c.yaml", "--samples", "8", "--", *task])
    assert seen["samples"] == 8 and seen["overrides"] == task
    argv = script.eval_args(options(overrides=task), "greedy", Path("out.json"), "root")
    assert value_of(argv, task[0]) == "1" and value_of(argv, task[2]) == "3"
    script.main(["eval", "--config", "c.yaml"])
    assert seen["overrides"] == []


def test_a_run_reports_both_modes(in_tmp_dir):
    config = fit_config(save_word_tokenizer(in_tmp_dir / "tokenizer"), seed=0)
    config["trainer"]["callbacks"] = config["trainer"]["callbacks"][:1]  # the reward
    path = in_tmp_dir / "configs" / "named_digit.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = in_tmp_dir / "report.json"
    argv = ["eval", "--config", str(path), "--num", "10", "--samples", "2", "--batch-size", "5", "--out", str(out)]
    load_script("eval_arithmetic").main(argv)
    report = json.loads(out.read_text())
    assert report["problems"] == 10 and report["greedy"]["samples"] == 1 and report["greedy"]["greedy"] is True
    sampled = report["temperature"]
    assert (sampled["samples"], sampled["responses"], sampled["greedy"]) == (2, 20, False)
    assert {"accuracy", "pass@2", "reward_mean"} <= set(sampled)


def test_the_reasoning_gym_table_reads_eval_reports_and_validation_logs(tmp_path):
    script = load_script("plot_reasoning_gym_run")
    report = tmp_path / "after.json"
    report.write_text(json.dumps({"accuracy": 0.4, "reasoning_gym/leg_counting/accuracy": 0.25, "prompts": 8}))
    assert script.held_out(str(report)) == {"leg_counting": 0.25}
    log = tmp_path / "metrics.csv"
    log.write_text("step,val/reasoning_gym/leg_counting/accuracy\n0,0.5\n4,0.75\n")
    assert script.held_out(str(log)) == {"leg_counting": 0.75}  # the last validation
