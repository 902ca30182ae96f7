"""Every numeric option has a domain, checked before any work: `check_range` and the domains the classes declare
beside their options (in Python), and `rlvr`'s check of the parsed config before any class is built (a few
lines, exit status 2)."""

import math
from pathlib import Path

import pytest

from rlvr_lightning.data import RLVRDataModule, SortTask
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies import SamplingConfig, hf_loading
from rlvr_lightning.policies.memory_estimate import ModelTooLargeError
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.runtime.option_domains import OptionValueError, Range, check_range

from .cli_runs import QUIET, SORT, TINY_LM, run


def test_check_range_names_the_option_the_value_and_the_valid_range():
    with pytest.raises(ValueError, match=r"^group_size=0 is not valid: must be an integer >= 1$"):
        check_range("group_size", 0, low=1, integer=True)
    with pytest.raises(OptionValueError, match=r"^top_p=0.0 is not valid: must be a finite number in \(0, 1\]$"):
        check_range("top_p", 0.0, 0, 1, low_open=True)
    with pytest.raises(OptionValueError, match=r"^lr=nan is not valid: must be a finite number >= 0$"):
        check_range("lr", math.nan, 0)
    with pytest.raises(OptionValueError, match=r"must be a finite number$"):
        check_range("weight", -math.inf)
    with pytest.raises(OptionValueError, match=r"must be an integer >= 1 \(or null\)$"):
        check_range("threads", 1.5, 1, integer=True, optional=True)
    with pytest.raises(OptionValueError, match="must be an integer"):
        check_range("epochs", True, 1, integer=True)  # a bool is no count
    with pytest.raises(OptionValueError, match="must be a finite number"):
        check_range("coef", None)
    for value, domain in [
        (1, Range(1, integer=True)),
        (None, Range(optional=True)),
        (1.0, Range(0, 1)),
        (-3.5, Range()),
    ]:
        domain.check("x", value)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: RLVRModule(ToySortPolicy(), group_size=0), "group_size=0 is not valid: must be an integer >= 1"),
        (lambda: RLVRModule(ToySortPolicy(), entropy_coef=math.nan), "entropy_coef=nan is not valid"),
        (lambda: SamplingConfig(temperature=math.inf), "sampling.temperature=inf is not valid"),
        (lambda: SamplingConfig(top_k=-1), "sampling.top_k=-1 is not valid: must be an integer >= 0"),
        (lambda: UpdateConfig(max_grad_norm=math.nan), "update.max_grad_norm=nan is not valid"),
        (lambda: UpdateConfig(max_consecutive_skips=0), "update.max_consecutive_skips=0 is not valid"),
        (lambda: RLVRDataModule(SortTask(), batch_size=-3), "batch_size=-3 is not valid: must be an integer >= 1"),
        (lambda: RLVRDataModule(SortTask(), num_workers=-1), "num_workers=-1 is not valid"),
        (lambda: SortTask(holdout_every=1), "holdout_every=1 is not valid: must be an integer >= 2"),
        (lambda: ToySortPolicy(embedding_dim=0), "embedding_dim=0 is not valid"),
    ],
)
def test_classes_check_their_option_ranges_in_python(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        build()


@pytest.fixture
def no_model_loading(monkeypatch):
    """Loading a model (or its tokenizer) fails the test: a bad option must stop the run before."""

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(hf_loading, "load_tokenizer", load)
    monkeypatch.setattr(hf_loading, "model_from_config", load)


@pytest.mark.parametrize(
    "option, value, must_be",
    [
        ("model.init_args.group_size", "0", "an integer >= 1"),
        ("model.init_args.entropy_coef", ".nan", "a finite number >= 0"),
        ("model.init_args.optimizer.init_args.lr", ".inf", "a finite number >= 0"),
        ("model.init_args.optimizer.init_args.lr", "-0.001", "a finite number >= 0"),
        ("model.init_args.update.mini_batch_size", "0", "an integer >= 1 (or null)"),
        ("model.init_args.update.max_grad_norm", "-1", "a finite number > 0 (or null)"),
        ("model.init_args.sampling.max_new_tokens", "0", "an integer >= 1"),
        ("model.init_args.kl.coef", "-0.1", "a finite number >= 0"),
        ("model.init_args.loss.init_args.clip_low", ".nan", "a finite number"),
        ("model.init_args.policy.init_args.lora.dropout", "1.0", "a finite number in [0, 1)"),
        ("data.init_args.batch_size", "0", "an integer >= 1"),
        ("data.init_args.task.init_args.length", "-2", "an integer >= 1"),
        ("torch_threads", "0", "an integer >= 1 (or null)"),
    ],
)
def test_a_value_out_of_its_domain_stops_the_run_before_the_model_loads(
    capsys, no_model_loading, option, value, must_be
):
    code, lines = run(capsys, "fit", "--config", TINY_LM, f"--{option}={value}", *QUIET)
    assert code == 2
    name = option.split("init_args.")[-1]  # the option as its class knows it: `update.max_grad_norm`, `lr`
    shown = {".nan": "nan", ".inf": "inf"}.get(value, value)
    assert lines[0].startswith(f"error: {name}={shown}"), lines
    assert lines[0].endswith(f"is not valid: must be {must_be}"), lines
    assert lines[1] == f"  at {option} (command line: --{option}={value})"
    assert len(lines) <= 5


def test_a_bad_value_in_a_config_file_names_its_line(in_tmp_dir, capsys):
    (in_tmp_dir / "bad.yaml").write_text("model:\n  init_args:\n    update:\n      epochs: 0\n")
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "bad.yaml", *QUIET)
    assert code == 2
    assert lines[:2] == [
        "error: update.epochs=0 is not valid: must be an integer >= 1",
        "  at model.init_args.update.epochs (bad.yaml:4)",
    ]


def test_an_absurd_model_size_is_refused_from_an_estimate_before_allocation(capsys, monkeypatch, in_tmp_dir):
    def allocate(*args, **kwargs):
        raise AssertionError("the model was allocated")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_config", allocate)
    for size in ("num_hidden_layers=1000000", "hidden_size=10000000"):
        option = f"model.init_args.policy.init_args.model.config.{size}"
        tokenizer = f"--model.init_args.policy.init_args.model.tokenizer={Path(TINY_LM).parent / 'digits_tokenizer'}"
        code, lines = run(capsys, "fit", "--config", TINY_LM, tokenizer, f"--{option}", *QUIET)
        assert code == 2 and len(lines) <= 5
        assert lines[0].startswith("error: model.config: the model it describes has about "), lines
        assert "GiB of memory is available" in lines[0]
        assert lines[1] == f"  at model.init_args.policy.init_args.model.config (command line: --{option})"
    with pytest.raises(ModelTooLargeError, match="embedding_dim: ToySortPolicy"):
        ToySortPolicy(embedding_dim=10**7)


def test_a_nan_reward_weight_is_refused_before_the_run(in_tmp_dir, capsys):
    callbacks = (
        "trainer:\n  callbacks:\n    - class_path: rlvr_lightning.rewards.SortInclusionOrderingReward\n"
        "      init_args: {weight: .nan}\n    - class_path: rlvr_lightning.advantages.GroupNormalizedAdvantage\n"
    )
    (in_tmp_dir / "nan.yaml").write_text(callbacks)
    code, lines = run(capsys, "fit", "--config", SORT, "--config", "nan.yaml", *QUIET)
    assert code == 2
    assert lines[0] == "error: weight=nan is not valid: must be a finite number"
    assert lines[1] == "  at trainer.callbacks[0].init_args.weight (nan.yaml:4)"


def test_an_input_file_must_exist_and_be_a_file(tmp_path):
    from rlvr_lightning.runtime.option_domains import InputFile, InputFileError

    (tmp_path / "train.jsonl").write_text("{}\n")
    InputFile().check("path", str(tmp_path / "train.jsonl"))
    InputFile(optional=True).check("val_path", None)
    with pytest.raises(InputFileError, match=r"^path='.*nope.jsonl' does not exist") as missing:
        InputFile().check("path", str(tmp_path / "nope.jsonl"))
    assert isinstance(missing.value, FileNotFoundError) and isinstance(missing.value, OptionValueError)
    with pytest.raises(InputFileError, match="is a directory, not a file"):
        InputFile().check("path", str(tmp_path))
    with pytest.raises(InputFileError, match="^path=None is not valid: must be an existing file$"):
        InputFile().check("path", None)  # null where a file is required
