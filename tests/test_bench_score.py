"""scripts/bench_score.py runs on a CPU (tiny shapes) and prints one row per dtype and variant: the kernel that
ran, and packed and prefix-shared log-probs equal to the padded ones."""

from pathlib import Path

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


def test_the_table_has_every_variant_with_its_kernel(capsys):
    bench = load_script("bench_score")
    assert bench.main(["--device", "cpu", "--tiny", "--warmup", "1", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["dtype", "variant"])
    rows = [line.split() for line in lines[header + 1 :] if not line.startswith("#")]
    assert [row[:2] for row in rows] == [[d, v] for d in ("fp32", "bf16") for v in bench.VARIANTS]
    assert [row[-1] for row in rows] == ["sdpa", "sdpa", "rlvr_packed_flex", "sdpa"] * 2
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)  # forward, backward ms
    assert all(float(row[5]) <= 1e-5 for row in rows[:4])  # fp32: packed and shared log-probs equal padded ones
    assert all(float(row[5]) <= 2e-2 for row in rows[4:])  # bf16 autocast
    assert lines[-1].startswith("# bf16 forward + backward over packed-flex's: padded ")


def fp32_rows(capsys, *options: str) -> dict[str, list[str]]:
    """bench_score's fp32 table on the tiny shape with `options`, by variant."""
    argv = ["--device", "cpu", "--tiny", "--warmup", "1", "--repeats", "1", "--dtypes", "fp32", *options]
    assert load_script("bench_score").main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line.split()[1]: line.split() for line in lines if line.startswith("fp32 ")}


def test_plain_activations_score_as_the_lean_ones(capsys):
    rows = fp32_rows(capsys, "--plain", "--variants", "padded", "packed-flex")
    assert list(rows) == ["padded", "packed-flex", "padded-plain", "packed-flex-plain"]
    assert all(float(row[5]) <= 1e-5 for row in rows.values())  # the same weights, the same log-probs


def test_compiled_layers_score_as_the_layers_as_written(capsys):
    rows = fp32_rows(capsys, "--compiled", "--variants", "padded", "shared")
    assert list(rows) == ["padded", "shared", "padded-compiled"]  # shared passes a cache: no compiled variant
    assert all(float(row[5]) <= 1e-5 for row in rows.values())


def test_a_variant_that_raises_gets_a_failed_row_the_others_still_run_and_the_status_is_1(capsys, monkeypatch):
    bench = load_script("bench_score")
    one_pass = bench.one_pass

    def one_pass_or_fail(policies, rollout, variant, autocast, *args):
        if variant == "packed-flex" and autocast is not None:
            raise RuntimeError("flex_attention: no kernel for this block size\nmore lines")
        return one_pass(policies, rollout, variant, autocast, *args)

    monkeypatch.setattr(bench, "one_pass", one_pass_or_fail)
    assert bench.main(["--device", "cpu", "--tiny", "--warmup", "1", "--repeats", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = {tuple(line.split()[:2]): line.split() for line in lines if line.startswith(("fp32 ", "bf16 "))}
    assert len(rows) == 2 * len(bench.VARIANTS)  # every dtype and variant has its row
    assert rows["bf16", "packed-flex"][2:7] == ["failed", "-", "-", "-", "RuntimeError:"]
    assert all(float(row[2]) > 0 for key, row in rows.items() if key != ("bf16", "packed-flex"))
    assert "# bf16 packed-flex failed: RuntimeError: flex_attention: no kernel for this block size" in lines
    assert lines[-1].startswith("# fp32 forward + backward over packed-flex's: padded ")  # bf16 has no ratio line
