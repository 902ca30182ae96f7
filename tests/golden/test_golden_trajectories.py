"""Golden trajectories: every shipped toy recipe (configs/sort_lecture.yaml, configs/sort_grpo.yaml, every config
in configs/recipes) and the length-bias configs' tiny language model (configs/length_bias/) rerun for 20 rollout
steps on seed 0 and one thread must log, step by step, the metrics stored in tests/golden/NAME.json (rewards,
loss, gradient norm, KL, entropy, clip fractions, ratios, validation accuracy: every column of the CSV log but the
timings), up to float noise, as recorded on a CPU of this machine's vendor (tests/golden/VENDOR/NAME.json).

A change that moves a trajectory is deliberate: regenerate the files in the same commit, with its reason,

    python -m tests.golden.update --reason "what changed and why the trajectories move"

and the diff of the files shows which runs and steps moved. The runs are made in one fresh process with torch's
and MKL's kernels pinned (tests/golden/runs.py: PINNED), so every x86-64 machine with AVX2 of one vendor computes
the same numbers; two runs on one machine are bitwise equal. An AMD EPYC and an Intel Xeon do not (they agree on
the first forward pass and differ in the last bits from the first update on), so each vendor has its files. A run
whose trajectory a change moved on one vendor's CPU has no file for the others until it is remade on theirs: there
it is skipped, named.
"""

import json

import pytest

from tests.golden.runs import cpu_vendor, golden_runs, run_pinned, same
from tests.golden.update import GOLDEN_DIR, read_golden, vendors

# The pinned runs are bitwise reproducible; the tolerance only absorbs last-bit differences another libm or
# compiler could give: float32 metrics (machine epsilon 1.2e-7) averaged over up to 1,024 responses carry a
# few ulps, far below 1e-5 relative; atol covers values that are themselves rounding noise (the mean of
# normalised advantages, ~1e-9). A learning rate 1% higher moves every run at its first or second logged step
# by 1.7e-3 relative or more (its largest change in that row), two orders of magnitude above RTOL.
RTOL, ATOL = 1e-5, 1e-6
NAMES = [run.name for run in golden_runs()]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    made = run_pinned([], tmp_path_factory.mktemp("golden") / "trajectories.json")
    if made["cpu_capability"] != "AVX2":  # a CPU without AVX2 (or not x86-64) computes other last bits
        pytest.skip(f"the golden runs need an x86-64 CPU with AVX2; torch reports {made['cpu_capability']}")
    return made


def first_difference(golden: list[dict], rows: list[dict]) -> str | None:
    """Where a trajectory first leaves its golden one, in words; None when it does not."""
    for index, (want, got) in enumerate(zip(golden, rows, strict=False)):
        step = int(want.get("step", index))
        if set(want) != set(got):
            return f"row {index} (step {step}) logs {sorted(set(got) ^ set(want))} differently from the golden row"
        moved = [k for k in want if not same(want[k], got[k], RTOL, ATOL)]
        if moved:
            return f"row {index} (step {step}): " + ", ".join(f"{k} {want[k]!r} -> {got[k]!r}" for k in moved[:4])
    if len(golden) != len(rows):
        return f"{len(rows)} rows logged, the golden file has {len(golden)}"
    return None


def test_every_golden_run_has_a_file_and_every_file_its_run():
    assert not list(GOLDEN_DIR.glob("*.json")), "golden files live in a folder per CPU vendor (tests/golden/VENDOR/)"
    files = {vendor: {path.stem for path in (GOLDEN_DIR / vendor).glob("*.json")} for vendor in vendors()}
    recorded = set().union(*files.values())
    assert recorded >= set(NAMES), (
        f"golden runs without a file on any CPU: {sorted(set(NAMES) - recorded)}; "
        "python -m tests.golden.update NAME --reason '...' writes them"
    )
    for vendor, names in files.items():
        assert names <= set(NAMES), f"{vendor} files without a run: {sorted(names - set(NAMES))}; update removes them"


@pytest.mark.parametrize("name", NAMES)
def test_trajectory_is_the_golden_one(fresh, name):
    golden = read_golden(name)
    if golden is None:
        others = [vendor for vendor in vendors() if read_golden(name, vendor) is not None]
        assert others, f"no golden file for {name}: python -m tests.golden.update {name} --reason '...'"
        pytest.skip(
            f"{name} is recorded on {others} CPUs only (a change moved it there); on this {cpu_vendor()} CPU "
            f"`python -m tests.golden.update {name} --reason '...'` records it"
        )
    rows = fresh["runs"][name]
    difference = first_difference(golden["rows"], rows)
    assert difference is None, (
        f"{name} left its golden trajectory at {difference}.\n"
        f"Recorded with torch {golden['recorded']['torch']} ({golden['recorded']['cpu_capability']}), "
        f"now torch {fresh['torch']} ({fresh['cpu_capability']}). If the change is meant, regenerate with its reason: "
        f"python -m tests.golden.update --reason '...'"
    )


def test_first_difference_names_the_step_and_metric():
    golden = [{"step": 0.0, "train/loss": 1.0}, {"step": 1.0, "train/loss": 0.5, "val/accuracy": float("nan")}]
    assert first_difference(golden, json.loads(json.dumps(golden))) is None
    noise = [{"step": 0.0, "train/loss": 1.0 + 5e-6}, golden[1]]
    assert first_difference(golden, noise) is None
    moved = [golden[0], {"step": 1.0, "train/loss": 0.5001, "val/accuracy": float("nan")}]
    assert first_difference(golden, moved) == "row 1 (step 1): train/loss 0.5 -> 0.5001"
    assert "logs ['val/accuracy']" in first_difference(golden, [golden[0], {"step": 1.0, "train/loss": 0.5}])
    assert first_difference(golden, golden[:1]) == "1 rows logged, the golden file has 2"


def test_cpu_vendor_reads_the_vendor_id(tmp_path):
    from tests.golden.runs import cpu_vendor

    for vendor_id, folder in (("AuthenticAMD", "amd"), ("GenuineIntel", "intel"), ("HygonGenuine", "hygongenuine")):
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {vendor_id}\nmodel name\t: x\n")
        assert cpu_vendor(tmp_path / "cpuinfo") == folder
    (tmp_path / "cpuinfo").write_text("processor\t: 0\n")
    assert cpu_vendor(tmp_path / "cpuinfo") == "unknown"


def test_update_writes_this_vendors_file_and_drops_the_others_of_a_moved_run(tmp_path, monkeypatch):
    from tests.golden import update

    rows = {"a": [{"step": 0.0, "train/loss": 1.0}], "b": [{"step": 0.0, "train/loss": 2.0}]}
    monkeypatch.setattr(update, "GOLDEN_DIR", tmp_path)
    monkeypatch.setattr(update, "cpu_vendor", lambda: "intel")
    runs = [type("Run", (), {"name": name, "command": lambda: "rlvr fit"}) for name in "ab"]
    monkeypatch.setattr(update, "golden_runs", lambda: runs)
    monkeypatch.setattr(update, "run_pinned", lambda names, out: {"torch": "t", "cpu_capability": "AVX2", "runs": rows})
    (tmp_path / "amd").mkdir()
    for name in ("a", "b", "gone"):
        (tmp_path / "amd" / f"{name}.json").write_text(update.render({"run": name, "rows": rows.get(name, [])}))
    update.main(["--reason", "first recording on intel"])  # new files: the amd ones stay, but the run-less one
    assert sorted(p.name for p in (tmp_path / "intel").iterdir()) == ["a.json", "b.json"]
    assert sorted(p.name for p in (tmp_path / "amd").iterdir()) == ["a.json", "b.json"]
    rows["a"] = [{"step": 0.0, "train/loss": 1.5}]  # a change moves run a
    update.main(["--reason", "moved a"])
    moved = update.read_golden("a", "intel")
    assert moved["rows"] == rows["a"] and moved["reason"] == "moved a"
    assert update.read_golden("a", "amd") is None  # recorded before the change
    assert update.read_golden("b", "amd") is not None
    assert update.read_golden("b", "intel")["reason"] == "first recording on intel"
