"""scripts/bench_decode.py runs on a CPU (tiny shapes) and prints one row per variant, the static ones checked
against the eager loop's tokens, and counts the operations a step launches from Python."""

from pathlib import Path

import pytest
import torch

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


def test_the_table_has_every_variant_and_their_tokens_equal_the_eager_loops(capsys):
    from tests.generation.static_pairs import static_decoding_unsupported

    if static_decoding_unsupported():
        pytest.skip(static_decoding_unsupported())
    bench = load_script("bench_decode")
    args = ["--device", "cpu", "--rows", "4", "--new-tokens", "6", "--prompt-tokens", "8", "--group", "2"]
    assert bench.main([*args, "--variants", "eager", "static", "--sync-every", "4", "--count-launches"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["model", "rows", "variant"])
    rows = [line.split() for line in lines[header + 1 :] if not line.startswith("#")]
    assert [row[:3] for row in rows] == [["tiny", "4", "eager"], ["tiny", "4", "static"]]
    assert " ".join(rows[1][-5:-2]) == "4 of 4" and float(rows[1][-1]) <= 1e-5  # same tokens, log-probs
    assert rows[1][-2] == "0"  # no row differs, so none by a neighbouring token
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in rows)  # ms/step, tokens/s
    assert all(int(row[9]) > 4 * 10 for row in rows)  # launches per step: at least ten per layer of 4
    assert lines[-2].startswith("# best: tiny 4 rows: eager ") and lines[-1].startswith("# tiny: ")


def test_rows_that_first_differ_by_a_neighbouring_token_are_counted():
    bench = load_script("bench_decode")
    reference = torch.tensor([[5, 9, 2], [5, 9, 2], [5, 9, 2], [5, 9, 2]])
    ids = torch.tensor(
        [
            [5, 9, 2],  # equal: not counted
            [5, 10, 7],  # first differs at 9 -> 10, then anything: counted
            [5, 11, 2],  # first differs at 9 -> 11: not counted
            [4, 40, 2],  # first differs at 5 -> 4: counted
        ]
    )
    assert bench.adjacent_first_differences(ids, reference) == 2


def test_a_variant_that_raises_gets_a_failed_row_the_others_still_run_and_the_status_is_1(capsys, monkeypatch):
    from tests.generation.static_pairs import static_decoding_unsupported

    if static_decoding_unsupported():
        pytest.skip(static_decoding_unsupported())
    bench = load_script("bench_decode")
    decode = bench.Case.decode

    def decode_or_fail(case, variant, *args, **kwargs):
        if variant == "static":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return decode(case, variant, *args, **kwargs)

    monkeypatch.setattr(bench.Case, "decode", decode_or_fail)
    args = ["--device", "cpu", "--rows", "4", "8", "--new-tokens", "4", "--prompt-tokens", "8", "--group", "2"]
    assert bench.main([*args, "--variants", "eager", "static", "aot_eager", "--repeats", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["model", "rows", "variant"])
    rows = [line.split() for line in lines[header + 1 :] if not line.startswith("#")]
    assert [row[2:4] for row in rows if row[2] == "static"] == [["static", "failed"]] * 2  # each batch size
    assert [row[2] for row in rows if row[3] != "failed"] == ["eager", "aot_eager"] * 2
    assert "# static failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in lines
    best = [i for i, line in enumerate(lines) if line.startswith("# best: ")]
    assert [lines[i].split()[2:4] for i in best] == [["tiny", "4"], ["tiny", "8"]]
    assert all("aot_eager" in lines[i] for i in best)
    first_of_8 = next(i for i, line in enumerate(lines) if line.split()[:2] == ["tiny", "8"])
    assert best[0] < first_of_8 < best[1]  # each batch's line as soon as it is measured
