"""scripts/compare.py: the numbers of its table on hand-made logs, and a tiny real comparison end to end."""

import math
from pathlib import Path

import pytest

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compare():
    return load_script("compare")


def write_log(path: Path, rewards: list[float], accuracies: dict[int, float]) -> Path:
    """A Lightning-style CSV: one row per train step, validation rows on their own (step = index of the last
    train step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["epoch,step,train/reward_mean,val/accuracy"]
    for step, reward in enumerate(rewards):
        lines.append(f"0,{step},{reward},")
        if step + 1 in accuracies:
            lines.append(f"0,{step},,{accuracies[step + 1]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_table_numbers_by_hand(compare, tmp_path):
    runs = []
    # recipe "a": seed 0 reaches 6.5 at step 3, seed 1 at step 2; final window of 2 steps
    for seed, rewards, accuracy in [(0, [5.0, 6.0, 6.5, 7.0], 0.5), (1, [6.0, 6.6, 6.8, 6.6], 0.3)]:
        path = write_log(tmp_path / "a" / f"seed_{seed}" / "metrics.csv", rewards, {2: 0.1, 4: accuracy})
        run = compare.Run(recipe="a", seed=seed, ok=True, wall_s=10.0 + seed)
        runs.append(compare.summarise_run(run, path, "train/reward_mean", threshold=6.5, final_window=2))
    # recipe "b": one seed never reaches it, the other fails
    path = write_log(tmp_path / "b" / "seed_0" / "metrics.csv", [1.0, 2.0, 3.0, 4.0], {4: 0.0})
    runs.append(
        compare.summarise_run(compare.Run(recipe="b", seed=0, ok=True, wall_s=5.0), path, "train/reward_mean", 6.5, 2)
    )
    runs.append(
        compare.summarise_run(
            compare.Run(recipe="b", seed=1, ok=False, error="boom"), tmp_path / "nope.csv", "train/reward_mean", 6.5, 2
        )
    )

    a0, a1 = runs[0], runs[1]
    assert a0.steps == [1, 2, 3, 4] and a0.val_steps == [2, 4]
    assert (a0.final, a1.final) == pytest.approx((6.75, 6.7))
    assert (a0.steps_to_threshold, a1.steps_to_threshold) == (3, 2)
    assert (a0.final_val_accuracy, a1.final_val_accuracy) == (0.5, 0.3)
    table = compare.markdown_table(runs, "train/reward_mean", 6.5, 2).splitlines()
    # mean 6.725, sample std |6.75 - 6.7| / sqrt(2) = 0.035; accuracy 40% ± 14.1%; steps (3 + 2) / 2 = 2.5 -> "2"
    assert table[2] == "| a | 6.72 ± 0.04 | 40.0% ± 14.1% | 2 | 10 s |"
    assert table[3] == "| b (1 failed) | 3.50 | 0.0% | never | 5 s |"
    assert runs[3].error == "boom" and math.isnan(runs[3].final)


def test_another_validation_metric_fills_the_accuracy_column(compare, tmp_path):
    path = tmp_path / "a" / "seed_0" / "metrics.csv"
    path.parent.mkdir(parents=True)
    path.write_text("epoch,step,train/reward_mean,val/accuracy,val/pass@32\n0,0,5.0,,\n0,0,,0.25,0.75\n")
    run = compare.Run(recipe="a", seed=0, ok=True, wall_s=3.0)
    run = compare.summarise_run(run, path, "train/reward_mean", 6.5, 1, val_metric="val/pass@32")
    assert run.final_val_accuracy == 0.75
    table = compare.markdown_table([run], "train/reward_mean", 6.5, 1, val_metric="val/pass@32").splitlines()
    assert "| last val/pass@32 |" in table[0] and table[2] == "| a | 5.00 | 75.0% | never | 3 s |"


def test_the_pass_at_k_table_by_hand(compare, tmp_path):
    import pass_at_k_report

    logs = {("a", 0): (0.25, 0.5), ("a", 1): (0.35, 0.7), ("b", 0): (0.5, 0.6)}
    runs = []
    for (recipe, seed), (at1, at4) in logs.items():
        path = tmp_path / recipe / f"seed_{seed}" / "metrics.csv"
        path.parent.mkdir(parents=True)
        path.write_text(
            f"epoch,step,train/reward_mean,val/pass@1,val/pass@4\n0,0,1.0,,\n0,0,,0.0,0.0\n0,1,,{at1},{at4}\n"
        )
        runs.append(compare.Run(recipe=recipe, seed=seed, ok=True))
    table = pass_at_k_report.pass_at_k_table(runs, ["a", "b"], tmp_path)
    # a: the last validation of each seed, (25 + 35) / 2 = 30 ± 7.1, (50 + 70) / 2 = 60 ± 14.1; b: one seed
    assert table == [
        "| recipe | pass@1 | pass@4 |",
        "| --- | ---: | ---: |",
        "| a | 30.0% ± 7.1% | 60.0% ± 14.1% |",
        "| b | 50.0% | 60.0% |",
    ]


def test_a_real_comparison_writes_the_table_and_the_plot(compare, tmp_path, capsys):
    out = tmp_path / "docs" / "cmp"
    status = compare.main(
        [
            "--recipes",
            str(REPO / "configs" / "recipes" / "grpo.yaml"),
            str(REPO / "configs" / "recipes" / "reinforce.yaml"),
            "--seeds",
            "0",
            "1",
            "--steps",
            "2",
            "--in_process",
            "--threshold",
            "0",
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "runs"),
            "--lengths",
            "--",
            "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1",
        ]
    )
    assert status == 0
    text = out.with_suffix(".md").read_text()
    main_table = text.split("Mean response length")[0]
    rows = [line for line in main_table.splitlines() if line.startswith("| grpo") or line.startswith("| reinforce")]
    assert len(rows) == 2 and all(" ± " in row for row in rows)
    assert "| 1 |" in text  # the threshold 0 is reached at the first step
    assert "2 recipes x 2 seeds" in text and "![reward curves](cmp.png)" in text
    png = out.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (tmp_path / "runs" / "summary.json").is_file()
    assert out.with_name("cmp_lengths.png").is_file() and "![length by correctness](cmp_lengths.png)" in text


def test_default_recipes_are_the_rl_recipes(compare):
    names = {path.stem for path in compare.default_recipes()}
    assert {"grpo", "dapo", "reinforce", "max_reward"} <= names
    assert {"grpo_k3_is", "grpo_opsm", "high_entropy", "gdpo", "passk", "clip_cov", "kl_cov"} <= names


def test_the_default_output_is_not_a_tracked_file(compare):
    args, _ = compare.parse_args([])
    assert args.out == REPO / "runs" / "compare" / "compare_sort"  # runs/ is not tracked; docs/compare_sort.* are


def write_length_log(path: Path, correct: list[float], incorrect: list[float]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["epoch,step,train/reward_mean,train/bias/length_correct,train/bias/length_incorrect"]
    for step, (c, i) in enumerate(zip(correct, incorrect, strict=True)):
        lines.append(f"0,{step},1.0,{c},{i}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_length_by_correctness_table_and_plot(compare, tmp_path):
    nan = float("nan")
    runs = []
    # seed 0: no correct response in the first step (NaN is skipped); window of 2 steps
    for seed, correct, incorrect in [
        (0, [nan, 4.0, 5.0, 7.0], [8.0, 6.0, 9.0, 11.0]),
        (1, [2.0, 2.0, 3.0, 5.0], [6.0, 6.0, 7.0, 9.0]),
    ]:
        path = write_length_log(tmp_path / "a" / f"seed_{seed}" / "metrics.csv", correct, incorrect)
        runs.append(
            compare.summarise_run(
                compare.Run(recipe="a", seed=seed, ok=True, wall_s=1.0), path, "train/reward_mean", 0.5, 2
            )
        )
    assert runs[0].length_steps == [1, 2, 3, 4] and runs[1].length_incorrect == [6.0, 6.0, 7.0, 9.0]
    row = compare.lengths.length_table(runs, ["a"], final_window=2).splitlines()[2]
    # correct, first 2 steps: seed 0 -> 4 (NaN skipped), seed 1 -> 2: 3 ± 1.41; last 2: 6 and 4: 5 ± 1.41
    # incorrect, first 2: 7 and 6: 6.5 ± 0.71; last 2: 10 and 8: 9 ± 1.41
    # whole run: correct 16/3 and 3 -> 4.17 ± 1.65; incorrect 8.5 and 7 -> 7.75 ± 1.06
    assert row == "| a | 3.00 ± 1.41 | 5.00 ± 1.41 | 4.17 ± 1.65 | 6.50 ± 0.71 | 9.00 ± 1.41 | 7.75 ± 1.06 |"
    png = tmp_path / "out_lengths.png"
    compare.lengths.plot_lengths(runs, ["a"], png, "t", smooth=2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert compare.lengths.lengths_path(tmp_path / "docs" / "cmp") == tmp_path / "docs" / "cmp_lengths.png"
