"""`--model.init_args.GROUP.FIELD=null` on the command line sets that one field to null (cli/nested_null.py)."""

from dataclasses import dataclass

import pytest
from jsonargparse import ArgumentParser

from rlvr_lightning.cli.app import main
from rlvr_lightning.cli.nested_null import keep_nested_nulls

from .cli_runs import QUIET, SORT, run


@dataclass(frozen=True)
class Group:
    lr: float | None = 0.1
    steps: int = 3


class Base:
    pass


class Model(Base):
    def __init__(self, group: Group = Group()):
        self.group = group


@pytest.mark.parametrize("null", ["null", "~"])
def test_a_null_nested_in_init_args_reaches_the_class(null):
    keep_nested_nulls()
    keep_nested_nulls()  # idempotent
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", type=Base)
    config = parser.parse_args([f"--model={__name__}.Model", f"--model.init_args.group.lr={null}"])
    assert config.model.init_args.group.lr is None and config.model.init_args.group.steps == 3
    config = parser.parse_args([f"--model={__name__}.Model", "--model.init_args.group.lr=0.5"])
    assert config.model.init_args.group.lr == 0.5


def test_rlvr_nulls_one_field_of_an_option_group_and_keeps_the_others(in_tmp_dir):
    cli = main(["--config", SORT, "--model.init_args.update.mini_batch_size=null", *QUIET], run=False)
    update = cli.model.update
    assert update.mini_batch_size is None
    assert (update.epochs, update.max_grad_norm) == (4, 1.0)  # the config's, not the defaults


def test_a_wrong_nested_value_is_named_as_given(in_tmp_dir, capsys):
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.update.mini_batch_size=abc", *QUIET)
    assert code == 2
    assert lines[0] == "error: mini_batch_size expects int, got 'abc'"
