"""scripts/bench_decode.py runs on a CPU (tiny shapes) and prints one row per variant, the static ones checked
against the eager loop's tokens, and counts the operations a step launches from Python."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("scripts_bench_decode", REPO / "scripts" / "bench_decode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_has_every_variant_and_their_tokens_equal_the_eager_loops(capsys):
    from tests.generation.static_pairs import static_decoding_unsupported

    if static_decoding_unsupported():
        pytest.skip(static_decoding_unsupported())
    bench = load_bench()
    args = ["--device", "cpu", "--rows", "4", "--new-tokens", "6", "--prompt-tokens", "8", "--group", "2"]
    assert bench.main([*args, "--variants", "eager", "static", "--sync-every", "4", "--count-launches"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["model", "rows", "variant"])
    rows = [line.split() for line in lines[header + 1 :] if not line.startswith("#")]
    assert [row[:3] for row in rows] == [["tiny", "4", "eager"], ["tiny", "4", "static"]]
    assert " ".join(rows[1][-4:-1]) == "4 of 4" and float(rows[1][-1]) <= 1e-5  # same tokens, log-probs
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)  # ms/step, tokens/s
    assert all(int(row[9]) > 4 * 10 for row in rows)  # launches per step: at least ten per layer of 4
    assert lines[-1].startswith("# best: tiny 4 rows: eager ")
