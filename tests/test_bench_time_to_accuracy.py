"""scripts/bench_time_to_accuracy.py's reports, on legs written by hand (no model is run)."""

import json
from pathlib import Path

import pytest

from tests.script_modules import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_time_to_accuracy")


def write_leg(out: Path, leg: str, seed: int, accuracy: list[float], step_s: float) -> None:
    points = [
        {"step": 10 * i, "train_seconds": 10 * i * step_s, "train_cpu_seconds": 10 * i * step_s, "accuracy": a}
        for i, a in enumerate(accuracy)
    ]
    run = {"points": points, "step_seconds": [step_s] * (10 * (len(accuracy) - 1))}
    (out / f"{leg}_s{seed}.json").write_text(json.dumps(run))


def test_time_to_accuracy_by_hand_and_a_leg_still_at_its_first_evaluation(bench, tmp_path, capsys):
    write_leg(tmp_path, "ours", 0, [0.38, 0.50, 0.70], 20.0)  # reaches TRL's 0.70 at step 20: 400 s
    write_leg(tmp_path, "trl", 0, [0.38, 0.60, 0.70], 60.0)  # 20 steps of 60 s: 1200 s
    write_leg(tmp_path, "ours", 1, [0.38], 20.0)  # a seed whose legs have only their step-0 evaluation
    write_leg(tmp_path, "trl", 1, [0.38], 60.0)
    bench.main(["report", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    # 0.70 - sqrt(0.7 * 0.3 / 100) = 0.6542: reached at step 20 as well; 400 s / 1200 s
    assert "seed 0: TRL's final accuracy 70% less one standard error is 65.4%; ours reached it after 0.33x" in out
    assert "and 70% after 0.33x; step time" in out
    assert "step time TRL / ours 3.00x" in out
    assert "| ours | 1 | 38% | 0 | 38% | 0.0 | - |" in out
    assert "seed 1:" not in out


def test_the_step_table_marks_steps_a_leg_has_not_reached(bench, tmp_path, capsys):
    write_leg(tmp_path, "ours", 2, [0.38, 0.55, 0.61], 20.0)
    write_leg(tmp_path, "ours_bf16", 2, [0.38], 25.0)
    bench.main(["distill_report", "--legs", "ours", "ours_bf16", "--out", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| leg | seed | step 0 | step 10 | step 20 | training min | median step s |"
    assert "| rlvr_lightning GRPO | 2 | 38% | 55% | 61% | 6.7 | 20.00 |" in lines  # 20 steps x 20 s = 6.7 min
    assert "| rlvr_lightning GRPO, bf16 sampling | 2 | 38% | - | - | 0.0 | - |" in lines


def test_the_target_within_one_standard_error_of_trl_final_accuracy(bench, tmp_path, capsys):
    write_leg(tmp_path, "ours", 0, [0.38, 0.66, 0.69], 20.0)  # never 0.70; 0.66 >= 0.6542 at step 10: 200 s
    write_leg(tmp_path, "trl", 0, [0.38, 0.60, 0.70], 60.0)
    write_leg(tmp_path, "ours", 3, [0.38, 0.60, 0.64], 20.0)  # 0.64 < 0.6542: never, either way
    write_leg(tmp_path, "trl", 3, [0.38, 0.60, 0.70], 60.0)
    bench.main(["report", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "seed 0: TRL's final accuracy 70% less one standard error is 65.4%; ours reached it after 0.17x" in out
    assert "and 70% after never" in out
    assert "seed 0: the same by CPU time: 0.17x and never" in out
    assert "seed 3: TRL's final accuracy 70% less one standard error is 65.4%; ours reached it after never" in out
    runs = bench.load(tmp_path)
    runs[("trl", 0)]["points"][-1]["problems"] = 400  # a quarter of the standard error: 0.70 - 0.0229
    assert bench.time_to_accuracy(runs[("ours", 0)], runs[("trl", 0)], within=1.0)[0] == pytest.approx(0.6771, 1e-4)
    assert bench.time_to_accuracy(runs[("ours", 0)], runs[("trl", 0)], within=1.0)[1] == pytest.approx(400 / 1200)


def test_a_missing_teacher_is_named_by_the_option_that_gave_it(bench, tmp_path):
    with pytest.raises(SystemExit, match=r"--teacher .*nowhere.ckpt does not exist"):
        bench.main(["distill", "--out", str(tmp_path), "--teacher", str(tmp_path / "nowhere.ckpt")])
    with pytest.raises(SystemExit, match=r"ours_s3/checkpoints/final.ckpt is written by `run --seeds 3`"):
        bench.main(["distill", "--out", str(tmp_path), "--teacher_seed", "3"])
