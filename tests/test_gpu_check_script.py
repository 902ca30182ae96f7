"""scripts/gpu_check.sh's control flow, with a stand-in for Python that records its calls: a part that runs a
script several times goes on after a failed run, the summary marks the part FAILED with the last failure's status,
and the check exits non-zero; the other parts still run. With TOTAL_LIMIT_S each part gets what is left of it (a
stand-in `timeout` records the limit), and the parts' variables reach their scripts."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  -) cat >/dev/null; echo "torch (stand-in)" ;;
  "-c import xdist"|-m\ rlvr_lightning.runtime.model_cache*) exit 1 ;;
  *bench_score.py*--no-compiled*) echo "# fp32 forward + backward over packed-flex's: padded 1.50x"; exit 3 ;;
  *bench_score.py*) echo "# bf16 forward + backward over packed-flex's: padded 1.20x" ;;
  *bench_step.py*--gpu-precision*) echo "trl / ours (medians): step 3.10x wall"; exit 1 ;;
  *bench_step.py*) echo "== smollm2: stand-in"; echo "trl / ours (medians): step 1.10x wall" ;;
  *bench_decode.py*) echo "# best: smollm2 128 rows: eager 9.00 ms/step, static 1.00 ms/step (9.00x)" ;;
esac
exit 0
"""

FAKE_TIMEOUT = r"""#!/usr/bin/env bash
echo "timeout $*" >> "$CALLS"
shift 3  # -k 20 SECONDS
exec "$@"
"""


def run_check(folder: Path, parts: list[str], **variables: str) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """gpu_check.sh `parts` in `folder` with the stand-in Python and a `timeout` that records its arguments and
    runs the part; (the run, the calls recorded, the output folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("python", FAKE_PYTHON), ("timeout", FAKE_TIMEOUT)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    calls, out = folder / "calls.txt", folder / "out"
    env = {**os.environ, "PYTHON": str(folder / "python"), "CALLS": str(calls), "GPU_CHECK_OUT": str(out)}
    env |= {"GPU_BUNDLE": str(folder / "no_bundle"), "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", **variables}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", *parts], cwd=REPO, env=env, capture_output=True, text=True)
    return done, calls.read_text().splitlines(), out


def test_a_failed_run_does_not_stop_its_part_and_the_summary_says_failed(tmp_path):
    done, calls, out = run_check(tmp_path, ["score", "bench", "decode"], PART_LIMIT_S="60")
    assert done.returncode == 1, done.stdout + done.stderr
    runs = [line for line in calls if line.startswith("scripts/")]
    assert [line.split()[0] for line in runs] == ["scripts/bench_score.py"] * 2 + ["scripts/bench_step.py"] * 2 + [
        "scripts/bench_decode.py"
    ]
    assert "--compiled" in runs[1] and "--gpu-precision" in runs[3]  # the run after each failure still happened
    summary = {line.split()[0]: line for line in (out / "summary.txt").read_text().splitlines()[2:]}
    assert summary["score"].split()[1:3] == ["FAILED", "(3)"]
    assert "bf16 forward + backward over packed-flex's: padded 1.20x" in summary["score"]  # the later run's figure
    assert summary["bench"].split()[1:3] == ["FAILED", "(1)"]
    assert summary["decode"].split()[1] == "ok" and "static 1.00 ms/step" in summary["decode"]


def run_within(
    tmp_path, total: int, parts: list[str], **variables: str
) -> tuple[subprocess.CompletedProcess, list[str], list[list[str]]]:
    """`run_check` with TOTAL_LIMIT_S=total; (the run, the parts' limits, the summary's rows)."""
    done, calls, out = run_check(tmp_path / f"within_{total}", parts, TOTAL_LIMIT_S=str(total), **variables)
    limits = [line.split()[3] for line in calls if line.startswith("timeout ")]
    summary = [line.split() for line in (out / "summary.txt").read_text().splitlines()[2:]]
    return done, limits, summary


def test_a_total_limit_gives_each_part_what_is_left_and_skips_the_parts_it_cannot_hold(tmp_path):
    done, limits, summary = run_within(tmp_path, 90, ["decode", "decode"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(limits) == 2 and all(55 <= int(seconds) <= 60 for seconds in limits)  # 90 s less 30, less set-up
    done, limits, summary = run_within(tmp_path, 50, ["decode", "bench"])  # 20 s left: under the 30 a part needs
    assert done.returncode == 1 and limits == []
    assert [row[:4] for row in summary] == [["decode", "not", "run", "(time)"], ["bench", "not", "run", "(time)"]]


def test_the_decode_and_equal_parts_run_the_variants_and_precisions_named(tmp_path):
    variables = dict(DECODE_VARIANTS="eager reduce-overhead", DECODE_ROWS="128", EQUAL_DTYPES="float32")
    done, calls, _ = run_check(tmp_path, ["decode", "equal"], **variables)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line for line in calls if line.startswith("scripts/bench_decode.py")]
    assert runs[0] == "scripts/bench_decode.py --device cuda --rows 128 --variants eager reduce-overhead"
    assert len(runs) == 2 and "--dtype float32" in runs[1]  # the equal part in fp32 alone
