"""scripts/learning_suite.py: seeds in fresh one-thread processes, bands checked per seed, records and plots;
the registry's sort-task entries (test_language_model_figures.py: the language-model ones)."""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[2]
# the recipes shipped in configs/recipes (SFT and expert iteration have no reward curve to band)
RECIPES = sorted(p.stem for p in (REPO / "configs" / "recipes").glob("*.yaml"))
QUICK = {"sort_lecture", "sort_grpo", "sft_then_grpo", "gvpo_stale"} | {
    f"recipe_{r}" for r in RECIPES if r not in ("sft", "expert_iteration")
}


# A run that logs one validation accuracy per seed, and what its process was: pid and thread settings.
FAKE_RUN = """
import json, os, sys
seed, run_dir = int(sys.argv[1]), sys.argv[2]
accuracy = {0: 0.8, 1: 0.5, 2: 0.9}[seed]
os.makedirs(run_dir + "/csv/version_0", exist_ok=True)
with open(run_dir + "/csv/version_0/metrics.csv", "w") as f:
    f.write("step,time/step_s,val/accuracy\\n0,30.0,\\n0,,0.1\\n1,30.0,\\n1,,%s\\n" % accuracy)
process = {"pid": os.getpid(), "omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS"),
           "cwd": os.getcwd(), "aten": os.environ.get("ATEN_CPU_CAPABILITY"), "cbwr": os.environ.get("MKL_CBWR")}
json.dump(process, open(run_dir + "/process.json", "w"))
"""


def fake_figure(figures, band, name="fake"):
    return figures.Figure(
        name,
        "nowhere",
        (figures.Command(("{python}", "-c", FAKE_RUN, "{seed}", "{run_dir}")),),
        (
            figures.Metric(
                "val", figures.csv_final(figures.CSV_LOG, "val/accuracy"), band, "last val/accuracy", percent=True
            ),
        ),
        curves=(figures.Curve("fake", figures.CSV_LOG),),
    )


def test_every_seed_runs_in_its_own_one_thread_process_and_is_checked_against_the_band(
    suite, figures, tmp_path, capsys
):
    figure = fake_figure(figures, figures.Band(0.6))
    status = suite.main(
        ["--workdir", str(tmp_path / "runs"), "--figures_dir", str(tmp_path / "docs"), "--plot"], figures=(figure,)
    )
    out = capsys.readouterr().out
    assert status == 1  # seed 1 (50%) is outside [60%, ...)
    rows = [line.split() for line in out.splitlines() if line.startswith("fake ")]
    assert [(row[2], row[3], row[-1]) for row in rows] == [
        ("0", "80.0%", "PASS"),
        ("1", "50.0%", "FAIL"),
        ("2", "90.0%", "PASS"),
    ]
    processes = [json.loads((tmp_path / "runs" / "fake" / f"seed_{s}" / "process.json").read_text()) for s in (0, 1, 2)]
    assert len({p["pid"] for p in processes} | {os.getpid()}) == 4
    assert all(p["omp"] == "1" and p["mkl"] == "1" for p in processes)
    assert all(p["aten"] == "avx2" and p["cbwr"] == "COMPATIBLE" for p in processes)  # the kernels tests/golden pins
    assert processes[0]["cwd"] == str((tmp_path / "runs" / "fake" / "seed_0").resolve())  # cwd="run_dir"

    record = json.loads((tmp_path / "docs" / "fake.json").read_text())
    metric = record["metrics"]["val"]
    assert metric["values"] == {"0": 0.8, "1": 0.5, "2": 0.9}
    assert metric["mean"] == pytest.approx(2.2 / 3) and metric["std"] == pytest.approx(0.2081666, abs=1e-6)
    assert metric["band"] == {"lo": 0.6, "hi": None, "over": "each", "text": ">= 60.0% every seed"}
    assert not metric["pass"] and not record["pass"] and record["seeds"] == [0, 1, 2]
    assert record["check"] == "python scripts/learning_suite.py --only fake --seeds 0 1 2"
    assert record["commands"][0].startswith("(in {run_dir}) python -c")
    assert record["date"].count("-") == 2
    environment = record["environment"]
    assert environment["threads"] == {"torch": 1, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert environment["kernels"]["ATEN_CPU_CAPABILITY"] == "avx2" and environment["torch"]["cpu_capability"] == "AVX2"
    assert {"python", "torch", "packages", "machine", "git", "date"} <= set(environment)
    assert (tmp_path / "docs" / "fake.png").stat().st_size > 0


def test_a_mean_band_a_failed_command_and_no_run(suite, figures, tmp_path, capsys):
    workdir, docs = str(tmp_path / "runs"), str(tmp_path / "docs")
    mean_band = fake_figure(figures, figures.Band(0.7, 0.8, over="mean"))  # mean 73.3%; seed 1 alone is not checked
    assert suite.main(["--workdir", workdir, "--figures_dir", docs], figures=(mean_band,)) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("fake ")]
    assert [len(row) for row in rows[:3]] == [4, 4, 4]  # per seed: a value, no band, no verdict
    assert rows[3] == ["fake", "val", "mean", "73.3%", "[70.0%,", "80.0%]", "mean", "PASS"]

    broken = figures.Figure(
        "broken",
        "nowhere",
        (figures.Command(("{python}", "-c", "raise SystemExit(3)")),),
        (figures.Metric("val", figures.csv_final(figures.CSV_LOG, "val/accuracy"), figures.Band(0.0), "x"),),
        seeds=(0,),
    )
    assert suite.main(["--workdir", workdir, "--figures_dir", docs], figures=(broken,)) == 1
    out = capsys.readouterr().out
    assert "command 1 exited with 3" in out and out.rstrip().splitlines()[-1].startswith("0 of 1 figures hold")
    assert json.loads((tmp_path / "docs" / "broken.json").read_text())["errors"]["0"].startswith(
        "command 1 exited with 3"
    )

    # --no_run reads the runs already there: the mean-band runs of above, checked against another band
    strict = fake_figure(figures, figures.Band(0.75))
    assert (
        suite.main(["--workdir", workdir, "--figures_dir", docs, "--no_run", "--seeds", "0", "2"], figures=(strict,))
        == 0
    )


# A failure wrapped by another exception, with more output after it: the root cause is what a reader needs.
WRAPPED_FAILURE = """
import sys
print("Seed set to 0")
try:
    raise FileNotFoundError("Model alias 'tiny' is not in the local cache: fetch it once")
except FileNotFoundError as error:
    print("a warning on stderr", file=sys.stderr)
    raise ValueError("Does not validate against any of the Union subtypes\\nGiven value: Namespace(...)") from error
"""


def test_a_failed_command_is_summarised_by_its_root_cause(suite, figures, tmp_path, capsys):
    wrapped = figures.Figure(
        "wrapped",
        "nowhere",
        (figures.Command(("{python}", "-c", WRAPPED_FAILURE)),),
        (figures.Metric("val", figures.csv_final(figures.CSV_LOG, "val/accuracy"), figures.Band(0.0), "x"),),
        seeds=(0,),
    )
    workdir, docs = str(tmp_path / "runs"), str(tmp_path / "docs")
    assert suite.main(["--workdir", workdir, "--figures_dir", docs], figures=(wrapped,)) == 1
    error = json.loads((tmp_path / "docs" / "wrapped.json").read_text())["errors"]["0"]
    assert error.startswith("command 1 exited with 1 (")
    assert error.endswith("): FileNotFoundError: Model alias 'tiny' is not in the local cache: fetch it once")
    assert "wrapped seed 0: FAILED: command 1 exited with 1" in capsys.readouterr().out

    log = tmp_path / "plain.log"  # no exception in the log: its last three lines
    log.write_text("one\ntwo\nthree\nfour\n")
    assert suite.failure(log) == "two | three | four"
    log.write_text("Seed set to 0\nerror: Model alias 'tiny' is not in the local cache\n  at model.name_or_path\n")
    assert suite.failure(log) == "error: Model alias 'tiny' is not in the local cache"


# A run that records when it ran, long enough for two at once to overlap.
TIMED_RUN = """
import json, sys, time
started = time.time()
time.sleep(1.0)
json.dump([started, time.time()], open(sys.argv[1] + "/interval.json", "w"))
"""


def test_a_figure_that_reads_wall_clock_time_runs_its_seeds_alone(suite, figures, tmp_path, capsys):
    def timed(name, alone):
        return figures.Figure(
            name,
            "nowhere",
            (figures.Command(("{python}", "-c", TIMED_RUN, "{run_dir}")),),
            (figures.Metric("t", figures.json_value("interval.json", "0"), figures.Band(0.0), "start"),),
            seeds=(0, 1),
            alone=alone,
        )

    workdir = tmp_path / "runs"
    shared, alone = timed("shared", False), timed("budget", True)
    args = ["--workdir", str(workdir), "--figures_dir", str(tmp_path / "docs"), "--jobs", "2"]
    suite.main(args, figures=(alone, shared))
    interval = {
        (name, seed): json.loads((workdir / name / f"seed_{seed}" / "interval.json").read_text())
        for name in ("shared", "budget")
        for seed in (0, 1)
    }

    def overlap(a, b):
        return interval[a][0] < interval[b][1] and interval[b][0] < interval[a][1]

    assert overlap(("shared", 0), ("shared", 1))  # --jobs 2 runs two at once
    for seed in (0, 1):
        assert not any(overlap(("budget", seed), other) for other in interval if other != ("budget", seed))
    suite.main(["--list"], figures=(alone, shared))
    assert "budget  [alone]  seeds 0 1" in capsys.readouterr().out


def test_list_and_unknown_names(suite, capsys):
    assert suite.main(["--list", "--only", "smollm2_*"]) == 0
    out = capsys.readouterr().out
    assert "bash '{repo}/scripts/train_smollm2_arithmetic.sh' '{run_dir}' --seed_everything '{seed}'" in out
    assert "CONFIG='{repo}/configs/smollm2_calculator.yaml'" in out
    with pytest.raises(SystemExit, match="--only nope names no figure; valid: sort_lecture, sort_grpo"):
        suite.main(["--only", "nope"])


def test_the_registry_quick_set_and_bands(suite, figures):
    names = [figure.name for figure in figures.FIGURES]
    assert len(names) == len(set(names))
    assert {figure.name for figure in suite.select(suite.parse_args(["--quick"]), figures.FIGURES)} == QUICK
    for figure in figures.FIGURES:
        assert figure.seeds == (0, 1, 2) and figure.metrics
        for metric in figure.metrics:
            finite = [bound for bound in (metric.band.lo, metric.band.hi) if bound is not None and math.isfinite(bound)]
            assert finite, f"{figure.name}.{metric.name} has no band"
    arithmetic = next(f for f in figures.FIGURES if f.name == "smollm2_arithmetic")
    assert (
        arithmetic.metrics[0].band == figures.Band(figures.ARITHMETIC_MIN_VAL_ACCURACY)
        and figures.ARITHMETIC_MIN_VAL_ACCURACY == 0.70
    )
    with pytest.raises(ValueError, match="over='all' is not valid; choose one of 'each', 'mean'"):
        figures.Band(0.5, over="all")


def test_curves_over_seeds_by_hand(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        curves = load_script("seed_curves", module_name="seed_curves")
    finally:
        sys.path.remove(str(REPO / "scripts"))
    path = tmp_path / "metrics.csv"
    path.write_text("step,time/step_s,val/accuracy\n0,60.0,\n0,,0.2\n1,120.0,\n1,,nan\n2,60.0,\n2,,0.4\n")
    assert curves.series(path, "val/accuracy") == ([1, 3], [1.0, 4.0], [0.2, 0.4])
    steps, mean, std = curves.over_steps([([1, 2, 3], [0.0, 0.5, 1.0]), ([2, 3], [0.3, 0.6])])
    assert steps.tolist() == [2, 3] and mean.tolist() == pytest.approx([0.4, 0.8])
    assert std.tolist() == pytest.approx([math.sqrt(0.02), math.sqrt(0.08)])
    grid, mean, std = curves.over_minutes([([0.0, 2.0], [0.0, 1.0]), ([0.0, 1.0], [1.0, 1.0])])
    assert grid[0] == 0.0 and grid[-1] == 1.0  # ends where the shorter seed ends
    assert mean[-1] == pytest.approx(0.75) and std[-1] == pytest.approx(math.sqrt(0.125))


def test_native_kernels_leave_the_choice_to_torch(suite, monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert suite.child_environment(REPO)["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "ATEN_CPU_CAPABILITY" not in suite.child_environment(REPO, native_kernels=True)


# A stand-in of scripts/bench_time_to_accuracy.py: each leg's held-out accuracy at steps 0, 10, ... (its JSON), and
# the teacher's checkpoint where `run --legs ours` writes it.
