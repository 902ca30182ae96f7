"""Bounded configuration parsing: a YAML alias bomb, an alias inside its own anchor or an oversized config (a
`--config` file or string, or a file a config names) is refused at once with a short error naming it, instead of
being expanded until memory runs out; ordinary aliases still work."""

from __future__ import annotations

import pytest
import yaml

from rlvr_lightning.cli import main
from rlvr_lightning.runtime.config_limits import (
    MAX_CONFIG_BYTES,
    ConfigTooLarge,
    _nodes_added_by_aliases,
    check_config_text,
)

from .cli_runs import QUIET, SORT, run

# 9 levels of 9 aliases ("billion laughs"): 9^9 strings from nine short lines
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{level}: &{level} [{','.join([f'*{chr(ord(level) - 1)}'] * 9)}]\n" for level in "bcdefghi"
)
BOMB_NODES = "490,329,036"  # 9^9 + 9^8 + ... strings and lists, minus the 81 nodes written


def test_the_nodes_aliases_add_are_counted_without_expanding_them():
    # written: the mapping, keys a and b, [1, 2] and its two items, b's list: 7 nodes; expanded: the mapping,
    # key a, [1, 2] (3 nodes), key b, b's list holding [1, 2] three times (1 + 3 * 3): 16 nodes
    assert _nodes_added_by_aliases(yaml.compose("a: &a [1, 2]\nb: [*a, *a, *a]\n")) == 16 - 7
    assert _nodes_added_by_aliases(yaml.compose("a: 1\nb: [2, 3]\n")) == 0
    assert _nodes_added_by_aliases(yaml.compose("a: &a [1, *a]\n")) is None  # inside its own anchor
    assert _nodes_added_by_aliases(yaml.compose(BOMB)) == int(BOMB_NODES.replace(",", ""))


@pytest.mark.timeout(60)  # the bomb expanded takes gigabytes and minutes
def test_an_alias_bomb_config_file_is_refused_at_once_naming_the_file(in_tmp_dir, capsys):
    (in_tmp_dir / "laughs.yaml").write_text(BOMB)
    code, lines = run(capsys, "fit", "--config", "laughs.yaml")
    assert code == 2
    assert lines == [
        f"error: config file 'laughs.yaml' has aliases (*name) that expand it by {BOMB_NODES} nodes, over the "
        "10,000 a config may add that way (nested anchors and aliases)",
        "  (run again with --debug (or RLVR_DEBUG=1) for the full message and traceback)",
    ]
    code, lines = run(capsys, "fit", "--config", SORT, "--config", BOMB)  # a config given as a string
    assert code == 2
    assert lines[0].startswith("error: the --config string has aliases (*name) that expand it by ")
    code, lines = run(capsys, "fit", "--config", SORT, "--model.init_args.sampling", BOMB)  # any other value
    assert code == 2
    assert lines[0].startswith("error: the value of --model.init_args.sampling has aliases (*name) that expand ")
    with pytest.raises(ConfigTooLarge, match="config file 'laughs.yaml' has aliases"):  # the library's entry
        main(["fit", "--config", "laughs.yaml"])


@pytest.mark.timeout(60)
def test_a_bomb_in_a_file_a_config_names_is_refused_by_the_parser(in_tmp_dir, capsys):
    (in_tmp_dir / "model.yaml").write_text(BOMB)
    with pytest.raises(SystemExit) as stopped:  # jsonargparse's own error: its YAML loader is bounded too
        main(["--config", SORT, "--model", "model.yaml", *QUIET], run=False)
    assert stopped.value.code == 2
    assert f"the config has aliases (*name) that expand it by {BOMB_NODES} nodes" in capsys.readouterr().err


def test_an_alias_inside_its_own_anchor_and_an_oversized_file_are_refused(in_tmp_dir, capsys):
    (in_tmp_dir / "loop.yaml").write_text("trainer: &t {callbacks: [*t]}\n")
    code, lines = run(capsys, "fit", "--config", "loop.yaml")
    assert code == 2
    assert lines[0] == (
        "error: config file 'loop.yaml' has an alias (*name) inside its own anchor (&name): it never ends"
    )
    big = "trainer:\n  callbacks:\n" + "    - {class_path: x}\n" * (MAX_CONFIG_BYTES // 20)
    (in_tmp_dir / "big.yaml").write_bytes(big.encode())
    code, lines = run(capsys, "fit", "--config", "big.yaml")
    assert code == 2
    assert lines[0] == f"error: config file 'big.yaml' is {len(big):,} bytes long, over the 4,194,304 a config may have"


def test_ordinary_aliases_and_long_configs_within_the_bounds_are_read(in_tmp_dir):
    (in_tmp_dir / "aliases.yaml").write_text(
        "trainer:\n  limit_train_batches: &steps 3\n  max_steps: *steps\n"
        "  callbacks:\n    - &reward {class_path: rlvr_lightning.rewards.SortInclusionOrderingReward}\n"
    )
    cli = main(["--config", SORT, "--config", "aliases.yaml", *QUIET], run=False)
    assert cli.trainer.limit_train_batches == cli.trainer.max_steps == 3
    check_config_text("x: [" + "1, " * 200_000 + "1]\n")  # 600 KB, no alias: read
    with pytest.raises(ConfigTooLarge, match="the config has aliases"):
        check_config_text("a: &a [" + "1, " * 100 + "1]\nb: [" + "*a, " * 100 + "*a]\n")
