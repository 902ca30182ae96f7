"""scripts/learning_suite.py: seeds in fresh one-thread processes, bands checked per seed, records and plots;
the registry's language-model entries against stand-ins of their scripts (same arguments, same outputs)."""

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the recipes shipped in configs/recipes (SFT and expert iteration have no reward curve to band)
RECIPES = sorted(p.stem for p in (REPO / "configs" / "recipes").glob("*.yaml"))
QUICK = {"sort_lecture", "sort_grpo", "sft_then_grpo", "gvpo_stale"} | {
    f"recipe_{r}" for r in RECIPES if r not in ("sft", "expert_iteration")
}


def load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def suite():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        yield load("learning_suite")
    finally:
        sys.path.remove(str(REPO / "scripts"))


@pytest.fixture(scope="module")
def figures(suite):
    return sys.modules["learning_figures"]


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


FAKE_TRAIN = """#!/usr/bin/env bash
# stand-in of scripts/train_smollm2_arithmetic.sh: RUN_DIR --seed_everything SEED -> RUN_DIR/csv/
set -euo pipefail
test -x "$PYTHON"  # the suite's interpreter, which the real script runs
run_dir=$1; seed=$3
mkdir -p "$run_dir/csv/version_0" "$run_dir/csv/checkpoints"
case $seed in 0) final=0.76;; 1) final=0.72;; *) final=0.64;; esac
printf 'step,time/step_s,train/rewards/math_accuracy,val/accuracy\\n' > "$run_dir/csv/version_0/metrics.csv"
for step in 0 1 2 3; do printf '%s,12.5,0.5,\\n' $step >> "$run_dir/csv/version_0/metrics.csv"; done
printf '1,,,0.3\\n3,,,%s\\n' $final >> "$run_dir/csv/version_0/metrics.csv"
echo "${CONFIG:-arithmetic} $seed" > "$run_dir/csv/checkpoints/final.ckpt"
"""
FAKE_EVAL = """import json, sys
args = sys.argv[1:]
config, ckpt, out = (args[args.index(flag) + 1] for flag in ("--config", "--ckpt", "--out"))
trained, seed = open(ckpt).read().split()
assert trained == config and args[0] == "eval" and args[args.index("--num") + 1] == "100", args
accuracy = {"0": 0.7, "1": 0.61, "2": 0.55}[seed]
if "--no-tools" in args:
    accuracy = 0.0
elif "--max-new-tokens" in args:
    assert args[args.index("--max-new-tokens") + 1] == "64", args
    accuracy = 1.0
json.dump({"greedy": {"accuracy": accuracy, "generation": {"tool_use_rate": 1.0}}}, open(out, "w"))
"""


def test_the_language_model_entries_run_their_scripts_and_read_what_they_leave(suite, figures, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "train_smollm2_arithmetic.sh").write_text(FAKE_TRAIN)
    (repo / "scripts" / "eval_arithmetic.py").write_text(FAKE_EVAL)
    workdir, docs = str(tmp_path / "runs"), str(tmp_path / "docs")
    status = suite.main(
        ["--only", "smollm2_arithmetic", "smollm2_calculator", "--workdir", workdir, "--figures_dir", docs, "--plot"],
        repo=repo,
    )
    out = capsys.readouterr().out
    assert status == 1
    verdicts = [
        (row.split()[0], row.split()[2], row.split()[3], row.split()[-1])
        for row in out.splitlines()
        if row.startswith("smollm2_")
    ]
    assert verdicts == [
        ("smollm2_arithmetic", "0", "76.0%", "PASS"),
        ("smollm2_arithmetic", "1", "72.0%", "PASS"),
        ("smollm2_arithmetic", "2", "64.0%", "FAIL"),
        ("smollm2_calculator", "0", "70.0%", "PASS"),
        ("smollm2_calculator", "1", "61.0%", "PASS"),
        ("smollm2_calculator", "2", "55.0%", "FAIL"),
        # tool use, 64 tokens, without the calculator
        *(("smollm2_calculator", seed, value, "PASS") for value in ("100.0%", "100.0%", "0.0%") for seed in "012"),
    ]
    assert (tmp_path / "docs" / "smollm2_arithmetic.png").is_file() and (
        tmp_path / "docs" / "smollm2_calculator.png"
    ).is_file()


def test_curves_over_seeds_by_hand(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        curves = load("seed_curves")
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
FAKE_BENCH = """import json, os, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
out, steps, seed = value("--out"), int(value("--steps")), int(value("--seeds"))
assert "--sequential" in args, args
if args[0] == "distill":
    assert os.path.isfile(value("--teacher")), value("--teacher")
    legs = ["distill", "mixed"]
else:
    after = args[args.index("--legs") + 1 :]
    legs = after[: next(i for i, a in enumerate(after + ["--"]) if a.startswith("--"))]
final = {"ours": 0.70, "trl": 0.68, "ours_bf16": 0.66, "distill": 0.68, "mixed": 0.66}
minutes = {"ours": 1.0, "trl": 3.0, "ours_bf16": 1.5, "distill": 1.2, "mixed": 1.2}
os.makedirs(out, exist_ok=True)
for leg in legs:
    accuracy = lambda s: round(0.38 + (final[leg] - 0.38 - 0.01 * seed) * s / steps, 4)
    marks = range(0, steps + 1, 10)
    points = [{"step": s, "train_seconds": 6 * minutes[leg] * s, "accuracy": accuracy(s)} for s in marks]
    json.dump({"points": points, "step_seconds": [6.0 * minutes[leg]] * steps}, open(f"{out}/{leg}_s{seed}.json", "w"))
    if leg == "ours":
        os.makedirs(f"{out}/ours_s{seed}/checkpoints", exist_ok=True)
        open(f"{out}/ours_s{seed}/checkpoints/final.ckpt", "w").write("teacher")
"""


def test_the_time_to_accuracy_entries_read_their_legs(suite, figures, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "bench_time_to_accuracy.py").write_text(FAKE_BENCH)
    workdir, docs = str(tmp_path / "runs"), str(tmp_path / "docs")
    names = ["time_to_accuracy", "bf16_sampling_smollm2", "distill_smollm2"]
    assert suite.main(["--only", *names, "--workdir", workdir, "--figures_dir", docs], repo=repo) == 0
    records = {name: json.loads((tmp_path / "docs" / f"{name}.json").read_text()) for name in names}
    values = {name: {m: v["values"]["0"] for m, v in record["metrics"].items()} for name, record in records.items()}
    # ours reaches TRL's final 68% less one standard error (63.34%, seed 0) at step 40 only (70% there; 62% at
    # step 30): 4 of TRL's 12 minutes
    assert values["time_to_accuracy"]["time_fraction"] == pytest.approx(4 / 12)
    assert values["time_to_accuracy"]["step_speedup"] == pytest.approx(3.0)
    assert values["time_to_accuracy"]["trl_final"] == pytest.approx(0.68)
    assert values["bf16_sampling_smollm2"]["bf16_minus_fp32"] == pytest.approx(0.66 - 0.70)
    # distillation at step 10 of 30: 0.38 + 0.30 / 3; GRPO: 0.38 + 0.32 / 3
    assert values["distill_smollm2"]["distill_lead_step10"] == pytest.approx(-0.02 / 3, abs=1e-4)
    assert values["distill_smollm2"]["distill_step30"] == pytest.approx(0.68)
    teacher = tmp_path / "runs" / "distill_smollm2" / "teacher" / "ours_s0.json"
    assert json.loads(teacher.read_text())["points"][-1]["step"] == 100  # one teacher, the recipe's 100 steps
    capsys.readouterr()


def test_the_reasoning_gym_entry_reads_validation_before_and_after(suite, figures, tmp_path, capsys):
    workdir = tmp_path / "runs"
    columns = [f"val/reasoning_gym/{d}/accuracy" for d in figures.REASONING_GYM_DATASETS]
    for seed in (0, 1, 2):
        run_dir = workdir / "reasoning_gym_smollm2" / f"seed_{seed}"
        for log, rows in (("before", [[0.4, 0.0, 0.25]]), ("csv", [[0.5, 0.0, 0.2], [0.6 - 0.01 * seed, 0.02, 0.25]])):
            (run_dir / log / "version_0").mkdir(parents=True)
            lines = ["step,curriculum/basic_arithmetic/level," + ",".join(columns)]
            lines += [f"{4 * i},{i}," + ",".join(map(str, row)) for i, row in enumerate(rows)]
            (run_dir / log / "version_0" / "metrics.csv").write_text("\n".join(lines) + "\n")
    argv = ["--only", "reasoning_gym_smollm2", "--no_run", "--workdir", str(workdir), "--figures_dir", str(tmp_path)]
    suite.main(argv)
    record = json.loads((tmp_path / "reasoning_gym_smollm2.json").read_text())
    values = {metric: v["values"] for metric, v in record["metrics"].items()}
    assert values["basic_arithmetic_gain"]["2"] == pytest.approx(0.18)
    assert values["letter_counting_after"]["1"] == pytest.approx(0.25)
    assert values["leg_counting_before"]["0"] == 0.0
    capsys.readouterr()


def test_the_async_entry_checks_the_update_ratio_not_the_machine_speed(suite, figures, tmp_path, capsys):
    # seed 0: a slow machine (17 and 27 updates, alone); seed 1: two runs at once (18 and 19); seed 2: no updates
    workdir = tmp_path / "runs"
    legs = {0: (17, 27), 1: (18, 19), 2: (0, 5)}
    for seed, counts in legs.items():
        run_dir = workdir / "async_curves" / f"seed_{seed}"
        run_dir.mkdir(parents=True)
        for leg, updates in zip(("staleness0", "staleness1"), counts, strict=True):
            result = {"updates": updates, "heldout_greedy/last_number_accuracy": 0.6}
            (run_dir / f"{leg}_seed{seed}.json").write_text(json.dumps(result))
    argv = ["--only", "async_curves", "--no_run", "--workdir", str(workdir), "--figures_dir", str(tmp_path)]
    suite.main(argv)
    metrics = json.loads((tmp_path / "async_curves.json").read_text())["metrics"]
    ratio = metrics["updates_ratio"]["values"]
    assert ratio["0"] == pytest.approx(27 / 17) and ratio["1"] == pytest.approx(19 / 18)
    assert ratio["2"] is None or math.isnan(ratio["2"])  # no updates at staleness 0: no ratio, and no pass
    assert not metrics["updates_ratio"]["pass"]
    bands = sys.modules["learning_figures_language_models"]
    assert bands.ASYNC_MIN_UPDATES <= 12 and bands.ASYNC_MIN_UPDATES_RATIO <= 27 / 17  # the slow machine's seed holds
    capsys.readouterr()
