"""`rlvr eval`: a checkpoint's held-out metrics as JSON, the same as the run's validation logged; pass@k and maj@k of
sampled evaluation by hand; its options' mistakes in a few lines."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from rlvr_lightning.cli.app import main
from rlvr_lightning.demos.named_digit import fit_config, save_word_tokenizer
from tests.cli_runs import QUIET, SORT, run

QUIET_EVAL = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]


def write_config(config: dict, path: Path) -> str:
    """`path`, not `<default_root_dir>/config.yaml`: each command saves its full config there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def logged_validations(directory: Path) -> list[dict[str, float]]:
    """The `val/` metrics of every validation the run's CSV log holds, in order."""
    (path,) = directory.rglob("metrics.csv")
    with open(path, newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if k.startswith("val/") and v} for row in csv.DictReader(handle)]
    return [row for row in rows if row]


# the checkpoint of a step holds the weights after its update, which that step's validation evaluated
@pytest.mark.filterwarnings("ignore:Using ModelCheckpoint with manual optimization and every_n_train_steps")
def test_eval_of_a_checkpoint_gives_exactly_what_its_validation_logged(in_tmp_dir):
    """A tiny Llama trains 4 GRPO steps on the named-digit task, validating (greedily, on the 50 held-out prompts)
    and saving a checkpoint after steps 2 and 4; `rlvr eval` of each checkpoint reports the accuracy and mean
    reward logged at its step, bit for bit."""
    config = fit_config(save_word_tokenizer(in_tmp_dir / "tokenizer"), seed=0, steps=4, batch_size=4)
    reward = config["trainer"]["callbacks"][0]
    reward["init_args"]["length"] = 1  # correct: the first response token is the digit (about 1 in 20 at random)
    config["data"]["init_args"]["val_batch_size"] = 20  # 20 + 20 + 10 prompts: a last batch that is not full
    config["trainer"].update(
        limit_val_batches=None,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
        logger={"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs"}},
        default_root_dir=str(in_tmp_dir),
    )
    config["trainer"]["callbacks"].append(
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": "ckpts", "filename": "{step}", "every_n_train_steps": 2, "save_top_k": -1},
        }
    )
    path = write_config(config, in_tmp_dir / "configs" / "named_digit.yaml")
    main(["fit", "--config", path])
    logged = logged_validations(in_tmp_dir / "logs")
    assert len(logged) == 2 and logged[0]["val/reward_mean"] != logged[1]["val/reward_mean"]
    assert max(row["val/accuracy"] for row in logged) > 0
    for step, expected in zip((2, 4), logged, strict=True):
        output = in_tmp_dir / f"eval_step{step}.json"
        checkpoint = in_tmp_dir / "ckpts" / f"step={step}.ckpt"
        main(["eval", "--config", path, "--ckpt_path", str(checkpoint), "--eval.output", str(output), *QUIET_EVAL])
        report = json.loads(output.read_text())
        assert report["accuracy"] == expected["val/accuracy"]
        assert report["reward_mean"] == expected["val/reward_mean"]
        assert report["response_length"] == expected["val/response_length"]
        assert (report["prompts"], report["responses"], report["samples"], report["greedy"]) == (50, 50, 1, True)
        assert report["checkpoint"] == str(checkpoint) and report["config"] == [path]
    untrained = in_tmp_dir / "eval_untrained.json"
    main(["eval", "--config", path, "--eval.output", str(untrained), *QUIET_EVAL])
    assert json.loads(untrained.read_text())["checkpoint"] is None


def scripted_config(directory: Path) -> str:
    """Three held-out prompts answered by `ScriptedTextPolicy` with the responses their metadata lists (cycling),
    scored by the boxed answer; the config validates greedily with one response per prompt."""
    val = [
        # correct 1 0 0 1; answers 4 5 - 4: the majority "4" is right
        {"prompt": "p0", "answer": "4", "responses": [r"\boxed{4}", r"\boxed{5}", "4", r"\boxed{4}"]},
        # correct 0 0 1 1; answers 7 7 3 3: a tie, the first seen ("7") wins, wrong
        {"prompt": "p1", "answer": "3", "responses": [r"\boxed{7}", r"\boxed{7}", r"\boxed{3}", r"\boxed{3}"]},
        # never correct
        {"prompt": "p2", "answer": "2", "responses": [r"\boxed{1}"]},
    ]
    config = {
        "trainer": {"callbacks": [
            {"class_path": "rlvr_lightning.rewards.MathAccuracyReward", "init_args": {"methods": ["boxed"]}},
            {"class_path": "rlvr_lightning.rewards.BoxedFormatReward", "init_args": {"weight": 0.5}},
        ]},
        "model": {
            "class_path": "rlvr_lightning.modules.RLVRModule",
            "init_args": {"policy": {"class_path": "tests.rewards.test_math_reward.ScriptedTextPolicy"}},
        },
        "data": {
            "class_path": "rlvr_lightning.data.RLVRDataModule",
            "init_args": {
                "batch_size": 2,
                "val_batch_size": 2,
                "task": {
                    "class_path": "rlvr_lightning.data.InlineTask",
                    "init_args": {"examples": val[:1], "val_examples": val},
                },
            },
        },
    }  # fmt: skip
    return write_config(config, directory / "scripted.yaml")


@pytest.mark.parametrize(
    "samples, expected",
    [
        # 12 responses, 4 correct, 11 boxed; pass@4: p0 and p1 have a correct response; maj@4: p0 only
        (4, {"accuracy": 4 / 12, "pass@4": 2 / 3, "maj@4": 1 / 3, "format_rate": 11 / 12}),
        # the first two responses: p0 1 0 (tie "4" / "5": "4", right), p1 0 0, p2 0 0
        (2, {"accuracy": 1 / 6, "pass@2": 1 / 3, "maj@2": 1 / 3, "format_rate": 1.0}),
    ],
)
def test_sampled_eval_reports_pass_at_k_and_majority_vote_by_hand(in_tmp_dir, samples, expected):
    output = in_tmp_dir / "eval.json"
    path = scripted_config(in_tmp_dir)
    main(["eval", "--config", path, "--eval.samples", str(samples), "--eval.output", str(output), *QUIET_EVAL])
    report = json.loads(output.read_text())
    assert {key: report[key] for key in expected} == pytest.approx(expected)
    assert (report["prompts"], report["responses"], report["samples"]) == (3, 3 * samples, samples)
    assert report["greedy"] is False and report["temperature"] == 1.0  # sampled, at the config's temperature


@pytest.mark.parametrize(
    "options, message, option",
    [
        (
            ["--eval.samples", "4", "--eval.greedy", "true"],
            "error: eval.greedy=True gives one response per prompt, not eval.samples=4; choose --eval.greedy false "
            "(sampled) or --eval.samples 1",
            "  at eval.greedy (command line: --eval.greedy true)",
        ),
        (
            ["--eval.temperature", "0.7"],  # the config validates greedily
            "error: eval.temperature=0.7 is the temperature of sampled decoding, and the evaluation is greedy; "
            "add --eval.greedy false or leave eval.temperature out",
            "  at eval.temperature (command line: --eval.temperature 0.7)",
        ),
        (
            ["--eval.samples", "0"],
            "error: eval.samples=0 is not valid: must be an integer >= 1 (or null)",
            "  at eval.samples (command line: --eval.samples 0)",
        ),
    ],
)
def test_a_bad_eval_option_is_named_before_anything_is_built(capsys, monkeypatch, options, message, option):
    import rlvr_lightning.cli.app as cli_main

    def no_build(*args, **kwargs):
        raise AssertionError("the configured classes were built")

    monkeypatch.setattr(cli_main.RLVRCLI, "instantiate_classes", no_build)
    code, lines = run(capsys, "eval", "--config", SORT, *QUIET, *options)
    assert code == 2 and lines[0] == message and lines[1] == option


def test_eval_of_the_last_checkpoint_of_a_run_that_has_none_fails(in_tmp_dir, capsys):
    code, lines = run(capsys, "eval", "--config", SORT, *QUIET, "--ckpt_path", "last")
    directory = in_tmp_dir / "runs" / "sort_grpo" / "checkpoints"
    assert code == 2 and lines[0] == (
        f"error: --ckpt_path last: {directory} holds no last.ckpt; name the run (--run_name) or the file, or leave "
        "--ckpt_path out to evaluate the config's weights"
    )


def test_eval_of_a_checkpoint_with_a_kl_reference_under_a_config_without_one(in_tmp_dir, monkeypatch, capsys):
    """A run with a KL reference checkpoints the reference's weights beside the policy's; `rlvr eval` under a config
    without one drops them (and a config with one keeps its own for a checkpoint without), and reports the same
    numbers either way. Resuming training under the other config still refuses the checkpoint."""
    short = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", *QUIET]
    checkpoints = {}
    for run_name, coef in (("kl", 0.04), ("plain", 0.0)):
        (in_tmp_dir / run_name).mkdir()
        monkeypatch.chdir(in_tmp_dir / run_name)  # the config names its checkpoint folder, runs/sort_grpo
        main(["fit", "--config", SORT, *short, f"--model.init_args.kl.coef={coef}"])
        checkpoints[run_name] = in_tmp_dir / run_name / "runs" / "sort_grpo" / "checkpoints" / "last.ckpt"
    reports = {}
    for run_name, checkpoint in checkpoints.items():
        for coef in (0.0, 0.04):
            output = in_tmp_dir / f"{run_name}_{coef}.json"
            options = ["--trainer.limit_val_batches=1", f"--model.init_args.kl.coef={coef}", *QUIET_EVAL]
            main(["eval", "--config", SORT, "--ckpt_path", str(checkpoint), "--eval.output", str(output), *options])
            reports[run_name, coef] = json.loads(output.read_text())["reward_mean"]
    assert reports["kl", 0.0] == reports["kl", 0.04] and reports["plain", 0.0] == reports["plain", 0.04]
    assert reports["kl", 0.0] != reports["plain", 0.0]  # two runs: the checkpoints' weights were read
    code, lines = run(capsys, "fit", "--config", SORT, *short, "--ckpt_path", str(checkpoints["kl"]))
    assert code == 2 and lines[0].startswith(
        "error: the checkpoint holds the weights of a reference that this config does not build (kl.coef, "
    ), lines


def test_eval_of_a_ppo_checkpoint_under_an_rlvr_config(in_tmp_dir):
    """A PPO run's checkpoint holds its critic and value head; `rlvr eval` under the GRPO recipe (the same policy and
    task) leaves them out and reports what the PPO config itself reports."""
    recipes = Path(SORT).parent / "recipes"
    short = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", *QUIET]
    main(["fit", "--config", str(recipes / "ppo.yaml"), *short])
    checkpoint = str(in_tmp_dir / "runs" / "ppo" / "checkpoints" / "last.ckpt")
    reports = []
    for recipe in ("ppo", "grpo"):
        output = in_tmp_dir / f"{recipe}.json"
        options = ["--trainer.limit_val_batches=1", "--eval.output", str(output), *QUIET_EVAL]
        main(["eval", "--config", str(recipes / f"{recipe}.yaml"), "--ckpt_path", checkpoint, *options])
        reports.append(json.loads(output.read_text()))
    assert reports[0]["reward_mean"] == reports[1]["reward_mean"] and reports[1]["checkpoint"] == checkpoint
