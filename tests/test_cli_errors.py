"""What `rlvr` prints for a configuration mistake: what is wrong, where, the valid choices and the
closest one, no usage dump and no traceback, exit status 2 (`--debug` keeps the old output)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_lightning.cli.app import entry_point

from .cli_runs import QUIET, SORT, TINY_LM, run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_unknown_option_in_a_config_file_names_file_line_and_the_closest_option(in_tmp_dir, capsys):
    bad = write(in_tmp_dir / "bad.yaml", "model:\n  init_args:\n    entropy_coeff: 0.3\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", bad)
    assert code == 2
    assert lines[0] == "error: RLVRModule has no option 'entropy_coeff'"
    assert lines[1] == f"  at model.init_args.entropy_coeff ({bad}:3)"
    assert lines[2] == "  did you mean 'entropy_coef'?"
    assert lines[3].startswith("  valid: aggregation, demonstrations, distillation, dynamic_sampling, entropy_coef,")
    assert "rlvr fit --model.help rlvr_lightning.modules.RLVRModule" in lines[4]
    assert len(lines) <= 6


def test_unknown_option_on_the_command_line(capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.policy.init_args.vocab_sise=3")
    assert code == 2
    assert lines[:3] == [
        "error: ToySortPolicy has no option 'vocab_sise'",
        "  at model.init_args.policy.init_args.vocab_sise "
        "(command line: --model.init_args.policy.init_args.vocab_sise=3)",
        "  did you mean 'vocab_size'?",
    ]


def test_misspelled_class_path_suggests_the_class(in_tmp_dir, capsys):
    bad = write(
        in_tmp_dir / "bad.yaml",
        "trainer:\n  callbacks:\n    - class_path: rlvr_lightning.rewards.SortInclusionOrderingRewrd\n",
    )
    code, lines = run(capsys, "fit", "--config", SORT, "--config", bad)
    assert code == 2
    assert "rlvr_lightning.rewards has no 'SortInclusionOrderingRewrd'" in lines[0]
    assert lines[1] == f"  at trainer.callbacks ({bad}:3)"
    assert lines[2] == "  did you mean 'rlvr_lightning.rewards.SortInclusionOrderingReward'?"


def test_unknown_section_and_unknown_trainer_option(in_tmp_dir, capsys):
    code, lines = run(
        capsys, "fit", "--config", SORT, "--config", write(in_tmp_dir / "a.yaml", "trainr:\n  max_epochs: 1\n")
    )
    assert (
        code == 2 and lines[0] == "error: unknown option 'trainr.max_epochs'" and "  did you mean 'trainer'?" in lines
    )
    code, lines = run(
        capsys, "fit", "--config", SORT, "--config", write(in_tmp_dir / "b.yaml", "trainer:\n  max_epoch: 1\n")
    )
    assert code == 2 and "  did you mean 'trainer.max_epochs'?" in lines


def test_a_value_the_module_rejects_at_construction(in_tmp_dir, capsys):
    bad = write(in_tmp_dir / "bad.yaml", "model:\n  init_args:\n    loss: ppo_clipp\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", bad, *QUIET)
    assert code == 2
    assert lines[0].startswith(
        "error: loss='ppo_clipp' is not valid; choose one of "
        "['pg', 'ratio', 'ppo_clip', 'gspo', 'cispo', 'sapo', 'luspo', 'vespo', 'gmpo', 'dppo', 'clip_cov', "
        "'kl_cov', 'high_entropy', 'topr', 'gppo', 'entropy_shaped', 'astar_po', 'luffy', 'm2po', 'dynamic_clip', "
        "'bapo', 'gvpo', 'archer', 'aspo', 'flowrl', 'simko']"
    )
    assert lines[1] == f"  at model.init_args.loss ({bad}:3)"
    assert lines[2] == "  did you mean 'ppo_clip'?"


def test_a_misspelled_option_of_an_option_group(in_tmp_dir, capsys):
    bad = write(in_tmp_dir / "bad.yaml", "model:\n  init_args:\n    group_size: 8\n    kl: {cof: 0.1}\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", bad, *QUIET)
    assert code == 2
    assert lines[0] == "error: kl has no option 'cof'"
    assert lines[1] == f"  at model.init_args.kl.cof ({bad}:4)"
    assert lines[2] == "  did you mean 'coef'?"
    assert lines[3] == "  valid: clamp, coef, estimator, mixup_alpha, mode, refresh_every, reset_optimizer"


def test_a_value_an_option_group_rejects_names_the_nested_option(in_tmp_dir, capsys):
    bad = write(in_tmp_dir / "bad.yaml", "model:\n  init_args:\n    kl:\n      mode: reward\n      coef: 0.0\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", bad, *QUIET)
    assert code == 2
    assert lines[0] == "error: kl.mode='reward' shapes the reward by kl.coef * KL, but kl.coef=0"
    assert lines[1] == f"  at model.init_args.kl.mode ({bad}:4)"


def test_a_misspelled_option_of_a_loss_class(in_tmp_dir, capsys):
    bad = write(
        in_tmp_dir / "bad.yaml",
        (
            "model:\n  init_args:\n    loss:\n      class_path: rlvr_lightning.core.PPOClip\n"
            "      init_args: {clip_hi: 0.3}\n"
        ),
    )
    code, lines = run(capsys, "fit", "--config", SORT, "--config", bad, *QUIET)
    assert code == 2
    assert lines[0] == "error: PPOClip has no option 'clip_hi'"
    assert lines[1] == f"  at model.init_args.loss.init_args.clip_hi ({bad}:5)"
    assert lines[2] == "  did you mean 'clip_high'?"
    assert lines[3] == "  valid: clip_high, clip_low, dual_clip"


def test_a_value_rejected_in_setup_names_the_option(in_tmp_dir, capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.update.mini_batch_size=300", *QUIET)
    assert code == 2
    assert lines[0].startswith("error: update.mini_batch_size=300 must divide the rollout size")
    assert (
        lines[1]
        == "  at model.init_args.update.mini_batch_size (command line: --model.init_args.update.mini_batch_size=300)"
    )


def test_a_type_error_and_a_missing_config_file(in_tmp_dir, capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.group_size=abc")
    assert code == 2 and lines[0] == "error: group_size expects int, got 'abc'"
    (in_tmp_dir / "sort_grpo.yaml").write_text("")
    code, lines = run(capsys, "fit", "--config", str(in_tmp_dir / "sort_grp.yaml"))
    assert code == 2 and lines[0].startswith("error: config file") and "did you mean" in lines[1]


def test_commands(capsys):
    code, lines = run(capsys, "fitt", "--config", SORT)
    assert code == 2 and lines[:3] == [
        "error: 'fitt' is not a command",
        "  did you mean 'fit'?",
        "  valid: fit, validate, predict, eval",
    ]
    code, lines = run(capsys, "test", "--config", SORT)
    assert code == 2 and "rlvr validate --config X --ckpt_path CKPT" in lines[0]


def test_debug_shows_the_parser_message_and_the_traceback(capsys, monkeypatch):
    monkeypatch.setenv("RLVR_DEBUG", "0")  # --debug sets it to 1 for the other ranks; restored after the test
    with pytest.raises(SystemExit) as exit_info:  # jsonargparse's own handling: usage, message, status 2
        entry_point(["fit", "--config", SORT, "--model.init_args.entropy_coeff=0.3", "--debug"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and "Option 'entropy_coeff' is not accepted" in err
    with pytest.raises(ValueError, match="ppo_clipp"):
        entry_point(["fit", "--config", SORT, "--model.init_args.loss=ppo_clipp", "--debug", *QUIET])
    assert os.environ["RLVR_DEBUG"] == "1"


def test_help_says_how_to_list_the_module_and_data_options(capsys):
    with pytest.raises(SystemExit):
        entry_point(["fit", "--help"])
    head = " ".join(capsys.readouterr().out.splitlines()[:12])
    assert "--model.help RLVRModule" in head and "--data.help RLVRDataModule" in head
    with pytest.raises(SystemExit):
        entry_point(["fit", "--model.help", "RLVRModule"])  # short names resolve: the modules are registered
    out = capsys.readouterr().out
    for option in (
        "--model.loss",
        "--model.kl.coef",
        "--model.kl.estimator",
        "--model.update.epochs",
        "--model.validation.greedy",
    ):
        assert option in out


def test_the_console_script_exits_2_with_the_short_message(in_tmp_dir):
    script = "import sys; from rlvr_lightning.cli.app import entry_point; sys.argv[0] = 'rlvr'; sys.exit(entry_point())"
    done = subprocess.run(
        [sys.executable, "-c", script, "fit", "--config", SORT, "--model.init_args.entropy_coeff=0.3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == "error: RLVRModule has no option 'entropy_coeff'", done.stderr
    assert len(done.stderr.splitlines()) <= 6


def test_top_level_help_describes_the_commands(capsys):
    with pytest.raises(SystemExit):
        entry_point(["--help"])
    out = capsys.readouterr().out
    assert "fit                 Train the module of the config." in out
    assert "Write completions for the held-out prompts to JSONL" in out and "forward function" not in out


def test_data_help_lists_every_task(capsys):
    with pytest.raises(SystemExit):
        entry_point(["fit", "--data.help", "RLVRDataModule"])
    out = " ".join(capsys.readouterr().out.split())
    for task in ("SortTask", "ArithmeticTask", "JSONLTask", "HFDatasetTask", "InlineTask"):
        assert f"rlvr_lightning.data.{task}" in out


def test_a_token_budget_no_row_fits(in_tmp_dir, capsys):
    """`update.micro_batch_tokens` below the longest response: at construction; below a sampled row: at the step."""
    option = "--model.init_args.update.micro_batch_tokens"
    code, lines = run(capsys, "fit", "--config", SORT, f"{option}=3", *QUIET)
    assert code == 2
    assert lines[0] == (
        "error: update.micro_batch_tokens=3 is smaller than a row can be (a prompt and up to 4 response tokens); "
        "valid: an integer >= the longest prompt + 4, or null"
    )
    assert lines[1] == f"  at model.init_args.update.micro_batch_tokens (command line: {option}=3)"
    code, lines = run(capsys, "fit", "--config", SORT, f"{option}=6", "--trainer.max_steps=1", *QUIET)
    assert code == 2
    assert lines[0] == (
        "error: update.micro_batch_tokens=6 is smaller than the longest row of this step (8 tokens, prompt + "
        "response); valid: an integer >= 8 (prompt + max_new_tokens fits every row), or null"
    )


@pytest.mark.parametrize(
    ("backend", "option", "value", "choices"),
    [
        ("{class_path: KVCacheGeneration, init_args: {dtype: float8}}", "dtype", "float8", "float32, bfloat16, auto"),
        (
            "{class_path: rlvr_lightning.generation.StaticCacheGeneration, init_args: {compile: reduce_overhead}}",
            "compile",
            "reduce_overhead",
            "auto, none, aot_eager, default, reduce-overhead, compiled-forward, cuda-graph",
        ),
    ],
)
def test_a_class_section_on_the_command_line_with_a_value_out_of_its_choices(capsys, backend, option, value, choices):
    """A class given on the command line is first tried as a config file's path; the error is the option's own."""
    code, lines = run(
        capsys, "fit", "--config", TINY_LM, "--model.init_args.policy.init_args.generation.backend", backend
    )
    assert code == 2
    assert lines[0] == f"error: {option}={value!r} is not valid"
    assert lines[1] == (
        f"  at model.init_args.policy.init_args.generation.backend.init_args.{option} "
        f"(command line: --model.init_args.policy.init_args.generation.backend {backend})"
    )
    assert f"  valid: {choices}" in lines


def test_a_misspelled_bare_class_name_lists_the_classes_the_option_accepts(capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.loss={class_path: PPOClp}")
    assert code == 2
    assert lines[0] == "error: class_path 'PPOClp' names no class this option accepts"
    assert lines[1].startswith("  at model.init_args.loss (command line: ")
    assert lines[2] == "  did you mean 'PPOClip'?"
    valid = lines[3].removeprefix("  valid: ").split(", ")
    assert {"PPOClip", "GSPO", "CISPO"} <= set(valid) and "GroupNormalizedAdvantage" not in valid


def test_a_dotted_option_below_a_class_without_its_first_part(capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.policy.init_args.generation.backend=3")
    assert code == 2
    assert lines[0] == "error: ToySortPolicy has no option 'generation'"
    assert lines[1].startswith("  at model.init_args.policy.init_args.generation (command line: ")
    assert lines[2].startswith("  valid: activation, embedding_dim,")


def test_a_misspelled_callback_appended_on_the_command_line(capsys):
    arg = "--trainer.callbacks+={class_path: GroupNormalizedAdvantag}"
    code, lines = run(capsys, "fit", "--config", SORT, arg)
    assert code == 2
    assert lines[0] == "error: class_path 'GroupNormalizedAdvantag' names no class this option accepts"
    assert lines[1] == f"  at trainer.callbacks (command line: {arg})"
    assert lines[2] == "  did you mean 'GroupNormalizedAdvantage'?"


def test_a_value_of_no_type_of_a_union_names_the_types(capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--seed_everything=x")
    assert code == 2
    assert lines[:2] == [
        "error: seed_everything expects bool or int, got 'x'",
        "  at seed_everything (command line: --seed_everything=x)",
    ]


def test_a_missing_data_file_stops_the_run_before_the_model_is_built(in_tmp_dir, capsys, monkeypatch):
    import functools

    from rlvr_lightning.policies import HFPolicy

    @functools.wraps(HFPolicy.__init__)  # the same options for the parser
    def built(*args, **kwargs):
        raise AssertionError("the policy was built before the data file was checked")

    monkeypatch.setattr(HFPolicy, "__init__", built)
    task = "{class_path: rlvr_lightning.data.JSONLTask, init_args: {path: train.jsonl}}"
    code, lines = run(capsys, "fit", "--config", TINY_LM, "--data.init_args.task", task)
    assert code == 2
    assert lines[0] == f"error: path='train.jsonl' does not exist (looked for {in_tmp_dir / 'train.jsonl'})"
    assert lines[1].startswith("  at data.init_args.task.init_args.path")


def test_a_task_smaller_than_one_batch_names_batch_size_before_training(capsys):
    task = (
        "{class_path: rlvr_lightning.data.InlineTask, init_args: {examples: [{prompt: ab, answer: b}, "
        "{prompt: cd, answer: d}], repeat: false}}"
    )
    code, lines = run(capsys, "fit", "--config", TINY_LM, "--data.init_args.task", task, *QUIET)
    assert code == 2
    assert lines[0] == (
        "error: batch_size=64 is not valid: the task has 2 training prompt(s), fewer than one batch of 64 x 1 rank(s)"
    )
    assert lines[1].startswith("  at data.init_args.batch_size (")


def test_a_value_of_none_of_a_unions_literals_lists_them_all(capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--trainer.precision=bf16_mixed")
    assert code == 2
    assert lines[:3] == [
        "error: precision='bf16_mixed' is not valid",
        "  at trainer.precision (command line: --trainer.precision=bf16_mixed)",
        "  did you mean 'bf16-mixed'?",
    ]
    assert {"bf16-mixed", "32-true", "64"} <= set(lines[3].removeprefix("  valid: ").split(", "))


def test_a_missing_model_file_names_the_option_that_holds_it(capsys):
    option = "model.init_args.policy.init_args.model.tokenizer"
    code, lines = run(capsys, "fit", "--config", TINY_LM, f"--{option}=configs/length_bias/no_tokenizer", *QUIET)
    assert code == 2
    assert lines[0].startswith("error: Tokenizer path 'configs/length_bias/no_tokenizer' does not exist")
    assert lines[1] == f"  at {option} (command line: --{option}=configs/length_bias/no_tokenizer)"


def test_lora_target_modules_the_model_lacks_lists_its_linear_layers(capsys):
    pytest.importorskip("peft")
    lora = "--model.init_args.policy.init_args.lora={r: 4, target_modules: [q_prj]}"
    code, lines = run(capsys, "fit", "--config", TINY_LM, lora, *QUIET)
    assert code == 2
    assert lines[0].startswith("error: lora.target_modules: no module of the model is named 'q_prj'; choose from [")
    assert lines[1] == f"  at model.init_args.policy.init_args.lora.target_modules (command line: {lora})"
    assert lines[2] == "  did you mean 'q_proj'?"


def test_a_build_error_outside_any_class_is_placed_at_the_option_holding_its_value(tmp_path, capsys):
    import yaml

    policy = yaml.safe_load(Path(TINY_LM).read_text())["model"]["init_args"]["policy"]
    wrapped = {"class_path": "rlvr_lightning.modules.policy_from_checkpoint"}
    wrapped["init_args"] = {"policy": policy, "checkpoint_path": "nope.ckpt"}
    overlay = write(tmp_path / "wrapped.yaml", yaml.safe_dump({"model": {"init_args": {"policy": wrapped}}}))
    code, lines = run(capsys, "fit", "--config", TINY_LM, "--config", overlay, *QUIET)
    assert code == 2
    assert lines[0] == "error: policy_from_checkpoint: checkpoint_path='nope.ckpt' does not exist"
    assert lines[1].startswith(f"  at model.init_args.policy.init_args.checkpoint_path ({overlay}:")


def test_a_required_argument_of_a_class_names_the_option(capsys):
    wrapped = (
        "--model.init_args.policy={class_path: rlvr_lightning.modules.policy_from_checkpoint, "
        "init_args: {policy: {class_path: rlvr_lightning.policies.ToySortPolicy}}}"
    )
    code, lines = run(capsys, "fit", "--config", SORT, wrapped)
    assert code == 2
    assert lines[:2] == [
        "error: policy_from_checkpoint needs checkpoint_path: it has no default",
        f"  at model.init_args.policy.init_args.checkpoint_path (command line: {wrapped})",
    ]


def test_a_value_outside_a_declared_choice_checked_early_gets_the_closest_and_the_choices(capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.aggregation.mode=token_mean")
    assert code == 2
    assert lines[0].startswith("error: aggregation.mode='token_mean' is not valid")
    assert lines[2:4] == [
        "  did you mean 'token-mean'?",
        "  valid: seq-mean-token-mean, token-mean, seq-mean-token-sum, seq-sum-constant, prompt-mean-token-mean, "
        "delta-l",
    ]
