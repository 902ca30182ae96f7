"""scripts/bench_score.py runs on a CPU (tiny shapes) and prints one row per dtype and variant: the kernel that
ran, and packed log-probs equal to the padded ones."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("scripts_bench_score", REPO / "scripts" / "bench_score.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_has_every_variant_with_its_kernel(capsys):
    bench = load_bench()
    assert bench.main(["--device", "cpu", "--tiny", "--warmup", "1", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["dtype", "variant"])
    rows = [line.split() for line in lines[header + 1 :] if not line.startswith("#")]
    assert [row[:2] for row in rows] == [[d, v] for d in ("fp32", "bf16") for v in bench.VARIANTS]
    assert [row[-1] for row in rows] == ["sdpa", "sdpa", "rlvr_packed_flex"] * 2
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)  # forward, backward ms
    assert all(float(row[5]) <= 1e-5 for row in rows[:3])  # fp32: packed log-probs equal the padded ones
    assert all(float(row[5]) <= 2e-2 for row in rows[3:])  # bf16 autocast
    assert lines[-1].startswith("# bf16 forward + backward over packed-flex's: padded ")
