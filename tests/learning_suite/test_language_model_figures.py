"""scripts/learning_suite.py: the registry's language-model entries against stand-ins of their scripts (same
arguments, same outputs)."""

import json
import math
import sys

import pytest

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


def test_the_async_entry_checks_the_update_ratio_in_the_synchronous_legs_time(suite, figures, tmp_path, capsys):
    # seed 0: alone (24 and 37 updates); seed 1: two runs at once (24 and 25); seed 2: a synchronous leg cut short
    workdir = tmp_path / "runs"
    legs = {0: ((24, 0.6), (37, 0.65)), 1: ((24, 0.6), (25, 0.45)), 2: ((0, 0.12), (5, 0.12))}
    for seed, results in legs.items():
        run_dir = workdir / "async_curves" / f"seed_{seed}"
        run_dir.mkdir(parents=True)
        for leg, (updates, accuracy) in zip(("staleness0", "staleness1"), results, strict=True):
            result = {"updates": updates, "heldout_greedy/last_number_accuracy": accuracy}
            (run_dir / f"{leg}_seed{seed}.json").write_text(json.dumps(result))
    argv = ["--only", "async_curves", "--no_run", "--workdir", str(workdir), "--figures_dir", str(tmp_path)]
    suite.main(argv)
    record = json.loads((tmp_path / "async_curves.json").read_text())
    metrics = record["metrics"]
    ratio = metrics["updates_ratio"]["values"]
    assert ratio["0"] == pytest.approx(37 / 24) and ratio["1"] == pytest.approx(25 / 24)
    assert ratio["2"] is None or math.isnan(ratio["2"])  # no updates at staleness 0: no ratio, and no pass
    assert not metrics["updates_ratio"]["pass"] and not record["pass"]
    assert metrics["staleness0_updates"]["values"] == {"0": 24, "1": 24, "2": 0}
    assert not metrics["staleness0_updates"]["pass"]  # seed 2's budget is not 24 updates' time
    assert not metrics["staleness1_heldout_last_number"]["pass"]  # seed 1: 45%
    bands = sys.modules["learning_figures_language_models"]
    (figure,) = [figure for figure in figures.FIGURES if figure.name == "async_curves"]
    command = " ".join(figure.commands[0].argv)
    assert f"--sync-steps {bands.ASYNC_SYNC_STEPS}" in command and "--minutes" not in command
    capsys.readouterr()
