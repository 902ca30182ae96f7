"""scripts/bench_step.py's table: a leg whose process fails costs its row, not the other legs' or cases' figures,
and the script then exits with status 1 (so a CI smoke run of it fails); the `trl_cb` leg is TRL with continuous
batching, its paged cache sized to the step."""

import subprocess
from pathlib import Path

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


def test_a_failed_leg_costs_its_row_and_the_exit_status(capsys, monkeypatch):
    bench = load_script("bench_step")
    calls = []

    def fake_leg(leg, case, model_dir, args, steps, tmp):
        calls.append((case, leg))
        if leg == "trl" and case == "tiny":
            raise subprocess.CalledProcessError(1, ["python", "bench_step.py", "--worker", leg])
        step = {"step": 2.0 if leg == "trl" else 1.0, "generation": 0.5, "cpu": 1.0, "generation_cpu": 0.5}
        step["peak_rss_mb"] = 100.0
        return [step] * (args.warmup + steps)

    monkeypatch.setattr(bench, "run_leg", fake_leg)
    monkeypatch.setattr(bench, "prompt_lengths", lambda model_dir, case: [10, 12])
    monkeypatch.setattr(bench, "smollm2_dir", lambda: Path("unused"))
    argv = ["--case", "tiny", "smollm2", "--steps", "2", "--rounds", "2", "--legs", "ours", "trl"]
    assert bench.main(argv) == 1
    out = capsys.readouterr().out
    # the failed leg is not retried in the second round; the other case runs both legs in both rounds
    smollm2_legs = [("smollm2", "ours"), ("smollm2", "trl")] * 2
    assert calls == [("tiny", "ours"), ("tiny", "trl"), ("tiny", "ours"), *smollm2_legs]
    assert "# tiny: the trl leg failed (exit 1; its error is above)" in out
    tiny, smollm2 = out.split("== smollm2")

    def rows(text):
        return [line.split()[0] for line in text.splitlines() if line.startswith(("ours   ", "trl    "))]

    assert rows(tiny) == ["ours"] and rows(smollm2) == ["ours", "trl"]
    assert "trl / ours (medians): step 2.00x wall" in smollm2 and "trl / ours" not in tiny


def test_the_continuous_batching_leg_sizes_its_paged_cache_to_the_step(monkeypatch):
    bench_trl = load_script("bench_step_trl")
    monkeypatch.setattr(bench_trl, "prompt_lengths", lambda model_dir, case: [40, 44])
    case = {"prompts": ["a", "b"], "generations": 8, "new_tokens": 300}
    # 16 rows; the longest row, 44 + 300 tokens, takes 2 blocks of 256; the prefill feeds 16 x 44 tokens at once
    expected = {"block_size": 256, "num_blocks": 32, "max_batch_tokens": 704}
    assert bench_trl.paged_cache_for(Path("unused"), case) == expected


def test_the_trl_cb_leg_runs_trl_with_continuous_batching(monkeypatch, tmp_path):
    bench = load_script("bench_step")
    seen = []

    class Timer:
        steps = [{"step": 1.0}]

    def fake_trl(model_dir, case, steps, seed, output_dir, bf16, device, continuous_batching):
        seen.append(continuous_batching)
        return Timer()

    monkeypatch.setattr(bench, "run_trl", fake_trl)
    for leg in ("trl", "trl_cb"):
        args = bench.argparse.Namespace(
            worker=leg, case=["tiny"], model_dir="unused", steps=1, seed=0, trl_bf16=False, device="cpu"
        )
        args.json = str(tmp_path / f"{leg}.json")
        assert bench.worker(args) == 0
    assert seen == [False, True]
