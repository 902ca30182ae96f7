"""scripts/bench_async.py curves: the budget of each leg. With `--sync-steps K` the staleness-0 leg runs first for K
updates, and the staleness-1 leg of the same seed trains for the time that took (read back from the first leg's
record, so a rerun that skips the finished leg gives the same budget); with `--minutes` both legs get that
max_time and alternate their order between seeds. The training runs are stand-ins: no model is loaded."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from tests.script_modules import SCRIPTS, load_script


@pytest.fixture
def bench(monkeypatch, tmp_path):
    """bench_async with `fit` recording each leg's trainer options, and training times of 611.4 s (staleness 0) and
    617.9 s (staleness 1)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    module = load_script("bench_async")
    runs = []

    def fit(config):
        import yaml

        trainer = yaml.safe_load(config.read_text())["trainer"]
        staleness = 0 if "staleness0" in config.name else 1
        runs.append((config.stem, trainer.get("max_time"), trainer.get("max_steps")))
        metrics = dict.fromkeys(module.CURVES, 0.1)
        rows = [{"step": float(i), "time/step_s": 30.0, **metrics} for i in range(4)]
        module.step_rows = lambda out, name: rows
        clock = SimpleNamespace(train_elapsed=(611.4, 617.9)[staleness], cpu=[1.0] * 4)
        return SimpleNamespace(trainer=SimpleNamespace(global_step=(24, 37)[staleness])), clock

    monkeypatch.setattr(module, "fit", fit)
    monkeypatch.setattr(
        module, "heldout_accuracy", lambda cli, num: ({"last_number_accuracy": 0.5, "math_accuracy": 0.4}, 1.0)
    )
    monkeypatch.setattr(module, "plot", lambda out, seeds, minutes: runs.append(("plot", round(minutes, 3))))
    yield module, runs, tmp_path
    sys.modules.pop("scripts_bench_async", None)


def test_sync_steps_give_staleness_1_the_time_staleness_0_took_for_its_updates(bench):
    module, runs, out = bench
    args = ["curves", "--seeds", "0", "1", "--sync-steps", "24", "--out", str(out)]
    module.main(args)
    assert runs == [
        ("staleness0_seed0", None, 24),
        ("staleness1_seed0", {"seconds": 612}, None),  # 611.4 s, whole seconds up
        ("staleness0_seed1", None, 24),  # staleness 0 first on every seed: its run sets the budget
        ("staleness1_seed1", {"seconds": 612}, None),
        ("plot", round(617.9 / 60, 3)),
    ]
    record = json.loads((out / "staleness1_seed0.json").read_text())
    assert record["budget"] == {"max_time": {"seconds": 612}} and record["train_elapsed_s"] == 617.9
    assert record["updates"] == 37

    (out / "staleness1_seed1.json").unlink()
    runs.clear()
    module.main(args)  # the staleness-0 leg is not rerun; its record sets the budget
    assert runs[:1] == [("staleness1_seed1", {"seconds": 612}, None)]


def test_minutes_give_both_legs_the_same_max_time_in_alternating_order(bench):
    module, runs, out = bench
    module.main(["curves", "--seeds", "0", "1", "--minutes", "12", "--out", str(out)])
    assert runs == [
        ("staleness0_seed0", "00:00:12:00", None),
        ("staleness1_seed0", "00:00:12:00", None),
        ("staleness1_seed1", "00:00:12:00", None),
        ("staleness0_seed1", "00:00:12:00", None),
        ("plot", 12.0),
    ]


def test_a_budget_is_minutes_or_sync_steps_not_both(bench, capsys):
    module, _, out = bench
    with pytest.raises(SystemExit):
        module.main(["curves", "--minutes", "12", "--sync-steps", "24", "--out", str(out)])
    assert "not allowed with argument" in capsys.readouterr().err
