"""scripts/bench_step.py's table: a leg whose process fails costs its row, not the other legs' or cases' figures,
and the script then exits with status 1 (so a CI smoke run of it fails)."""

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
