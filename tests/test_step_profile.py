"""`BENCH_PROFILE=1` (scripts/step_profile.py): a `bench_step.py` leg runs one step more, which `torch.profiler`
records and reports on standard error (each timed section's host time, device time and operators), and leaves it out
of the steps it writes."""

import json
import sys
from types import SimpleNamespace

import torch

from tests.script_modules import load_script


def test_a_profiled_leg_runs_one_step_more_and_reports_it_outside_its_timings(monkeypatch, tmp_path, capsys):
    bench = load_script("bench_step")
    cases = sys.modules[bench.profiled_steps.__module__]
    monkeypatch.setenv("BENCH_PROFILE", "1")
    monkeypatch.setattr(cases, "PROFILE_STEP", None)
    monkeypatch.setattr(cases, "PROFILE_LABEL", "")
    ran = []

    def fake_trl(model_dir, case, steps, seed, output_dir, bf16, device, continuous_batching):
        ran.append(steps)
        timer = cases.StepTimer("cpu")
        work = SimpleNamespace(score=lambda x: (x @ x).relu().sum())
        timer.wrap(work, "score", "logprob_forward")
        for _ in range(steps):
            timer.begin()
            work.score(torch.ones(32, 32))
            timer.end()
        return timer

    monkeypatch.setattr(bench, "run_trl", fake_trl)
    args = bench.argparse.Namespace(
        worker="trl", case=["tiny"], model_dir="unused", steps=2, seed=0, trl_bf16=False, device="cpu"
    )
    args.json = str(tmp_path / "trl.json")
    assert bench.worker(args) == 0
    assert ran == [3]
    assert len(json.loads((tmp_path / "trl.json").read_text())) == 2
    err = capsys.readouterr().err
    assert err.count("# profile of one step, trl, tiny (cpu)") == 1
    section = next(line for line in err.splitlines() if line.startswith("logprob_forward"))
    host_ms, device_ms, operators = section.split()[1:]
    assert float(host_ms) > 0 and float(device_ms) == 0 and int(operators) >= 3  # matmul, relu, sum


def test_without_the_variable_a_leg_runs_the_steps_it_measures(monkeypatch):
    bench = load_script("bench_step")
    monkeypatch.delenv("BENCH_PROFILE", raising=False)
    assert bench.profiled_steps(4, "ours, tiny") == 4
