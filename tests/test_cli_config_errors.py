"""Config and data file mistakes on the `rlvr` command line: YAML syntax errors by file, line and column, empty
files, directories told from missing files, option prefixes, missing optional dependencies and relative paths
run from the wrong directory; a few lines each, exit status 2, no traceback."""

import importlib.util
import json

import pytest
import yaml

from rlvr_lightning.policies import hf_loading

from .cli_runs import QUIET, ROOT, SORT, TINY_LM, run
from .gsm8k_tiny import write_tiny_gsm8k_override

GSM8K_RECIPE = str(ROOT / "configs" / "gsm8k_qwen2.5_math_1.5b.yaml")


def test_a_yaml_syntax_error_names_file_line_and_column(in_tmp_dir, capsys):
    (in_tmp_dir / "bad.yaml").write_text("model:\n  init_args:\n    group_size: [8\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "bad.yaml")
    assert code == 2
    assert lines[0] == "error: YAML syntax error in config file 'bad.yaml': expected ',' or ']', but got '<stream end>'"
    assert lines[1] == "  at bad.yaml:4:1"
    assert lines[2] == "  while parsing a flow sequence at line 3, column 17"


def test_a_tab_in_a_config_file_names_its_line(in_tmp_dir, capsys):
    (in_tmp_dir / "tabs.yaml").write_text("model:\n  init_args:\n\tgroup_size: 8\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "tabs.yaml")
    assert code == 2
    assert lines[0].startswith("error: YAML syntax error in config file 'tabs.yaml'")
    assert lines[1:3] == ["  at tabs.yaml:3:1", "  line 3 has a tab: YAML indents with spaces only"]


def test_an_empty_config_file_says_empty_file(in_tmp_dir, capsys):
    (in_tmp_dir / "empty.yaml").write_text("")
    (in_tmp_dir / "comments.yaml").write_text("# nothing yet\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "empty.yaml")
    assert code == 2 and lines[0] == "error: config file 'empty.yaml' has no options: empty file"
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "comments.yaml")
    assert code == 2 and lines[0] == "error: config file 'comments.yaml' has no options: empty file (only comments)"
    (in_tmp_dir / "configs").mkdir()
    code, lines = run(capsys, "fit", "--config", "configs")
    assert code == 2 and lines[0] == "error: config file 'configs' is a directory, not a file"


def jsonl_task_config(path: str) -> str:
    task = f"    task:\n      class_path: rlvr_lightning.data.JSONLTask\n      init_args: {{path: {path}}}\n"
    return "data:\n  init_args:\n" + task


def test_a_jsonl_path_that_is_a_directory_is_told_from_a_missing_file(in_tmp_dir, capsys):
    (in_tmp_dir / "train.jsonl").mkdir()
    (in_tmp_dir / "dir.yaml").write_text(jsonl_task_config("train.jsonl"))
    (in_tmp_dir / "missing.yaml").write_text(jsonl_task_config("nope.jsonl"))
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "dir.yaml", *QUIET)
    assert code == 2
    assert lines[0] == f"error: path='train.jsonl' is a directory, not a file ({in_tmp_dir / 'train.jsonl'})"
    assert lines[1] == "  at data.init_args.task.init_args.path (dir.yaml:5)"
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "missing.yaml", *QUIET)
    assert code == 2
    assert lines[0] == f"error: path='nope.jsonl' does not exist (looked for {in_tmp_dir / 'nope.jsonl'})"


def test_a_bad_data_line_is_named_by_file_and_line_alone(in_tmp_dir, capsys):
    """Not followed by an option or "valid:" choices (no option is wrong: the data file is)."""
    override = yaml.safe_load(write_tiny_gsm8k_override(in_tmp_dir, accelerator="cpu").read_text())
    lines = [json.dumps({"question": f"{a} + 1?", "answer": f"#### {a + 1}"}) for a in range(3)]
    (in_tmp_dir / "missing_field.jsonl").write_text("\n".join([*lines, json.dumps({"question": "2 + 2?"})]) + "\n")
    override["data"]["init_args"]["task"]["init_args"] = {"path": "missing_field.jsonl"}
    (in_tmp_dir / "tiny.yaml").write_text(yaml.safe_dump(override))
    code, lines = run(capsys, "fit", "--config", GSM8K_RECIPE, "--config", "tiny.yaml")
    assert code == 2
    assert lines[-2:] == [
        "error: missing_field.jsonl:4: missing field 'answer' (the record has question)",
        "  (run again with --debug (or RLVR_DEBUG=1) for the full message and traceback)",
    ]


def test_a_prefix_of_an_option_is_an_unknown_option(capsys):
    for given in (["--trainer.max_epoch=2"], ["--trainer.max_epoch", "2"]):
        code, lines = run(capsys, "fit", "--config", SORT, *given, *QUIET)
        assert code == 2
        assert lines[0] == "error: unknown option 'trainer.max_epoch'"
        assert "  did you mean 'trainer.max_epochs'?" in lines


@pytest.fixture
def no_model_loading(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the missing dependency was noticed")

    monkeypatch.setattr(hf_loading, "model_from_config", load)
    monkeypatch.setattr(hf_loading, "load_model", load)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_backend_without_vllm_names_the_install_command_before_the_model_loads(capsys, no_model_loading):
    backend = "--model.init_args.policy.init_args.generation.backend=rlvr_lightning.generation.VLLMGeneration"
    code, lines = run(capsys, "fit", "--config", TINY_LM, backend, *QUIET)
    assert code == 2 and len(lines) <= 4
    assert lines[0].startswith("error: VLLMGeneration needs vLLM, which is not installed in this environment: ")
    assert "pip install -e '.[vllm]'" in lines[0] and "scripts/vllm_cpu_env.sh" in lines[0]
    assert lines[1] == "  at model.init_args.policy.init_args.generation.backend"


def test_lora_without_peft_names_the_install_command_before_the_model_loads(capsys, monkeypatch, no_model_loading):
    monkeypatch.setattr(hf_loading, "peft_installed", lambda: False)
    code, lines = run(capsys, "fit", "--config", TINY_LM, "--model.init_args.policy.init_args.lora.r=8", *QUIET)
    assert code == 2
    assert lines[0] == (
        "error: LoRA (lora.r > 0) needs the peft package, which is not installed: pip install 'rlvr-lightning[hf]' "
        "(or: pip install peft)"
    )


def test_a_relative_path_of_a_shipped_config_run_elsewhere_says_where_it_looked(in_tmp_dir, capsys):
    code, lines = run(capsys, "fit", "--config", TINY_LM, *QUIET)
    assert code == 2 and len(lines) <= 5
    assert f"({in_tmp_dir / 'configs' / 'length_bias' / 'digits_tokenizer'})" in lines[0]  # where it looked
    assert lines[2] == (
        f"  'configs/length_bias/digits_tokenizer' is read relative to the current directory ({in_tmp_dir}); "
        f"it exists under {ROOT}: the shipped configs' paths are relative to the repository root, run rlvr from there"
    )
