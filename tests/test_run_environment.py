"""rlvr_lightning.runtime.run_environment: the record's keys and types, with and without git; `rlvr fit` writes it."""

import json
import subprocess
from pathlib import Path

import torch

from rlvr_lightning.cli.app import main
from rlvr_lightning.runtime import run_environment
from rlvr_lightning.runtime.run_environment import environment_record

REPO = Path(__file__).resolve().parents[1]


def test_the_record_names_software_threads_machine_commit_and_date(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    record = environment_record()
    json.dumps(record)  # JSON-able as it is
    assert set(record) == {"date", "python", "torch", "packages", "threads", "kernels", "machine", "git"}
    assert record["kernels"] == {"ATEN_CPU_CAPABILITY": None, "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": None}
    assert record["torch"]["version"] == torch.__version__
    assert record["torch"]["build"] == (
        "cpu" if torch.version.cuda is None else f"cuda {torch.version.cuda}"
    ) or record["torch"]["build"].startswith("rocm")
    assert isinstance(record["torch"]["gpus"], list)
    assert record["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(record["packages"]) == {
        "transformers",
        "lightning",
        "peft",
        "numpy",
        "math_verify",
        "jsonargparse",
        "trl",
        "vllm",
    }
    import lightning
    import numpy

    assert record["packages"]["lightning"] == lightning.__version__
    assert record["packages"]["numpy"] == numpy.__version__
    assert all(version is None or isinstance(version, str) for version in record["packages"].values())
    assert record["threads"]["torch"] == torch.get_num_threads()
    assert record["threads"]["OMP_NUM_THREADS"] == "1"
    machine = record["machine"]
    assert isinstance(machine["platform"], str) and isinstance(machine["cpu"], str) and machine["cpu"]
    assert isinstance(machine["logical_cores"], int) and machine["logical_cores"] >= 1
    assert isinstance(machine["memory_gib"], float) and machine["memory_gib"] > 0
    assert record["date"][:2] == "20" and "T" in record["date"]
    assert isinstance(record["python"], str)


def test_the_commit_is_the_checkout_head():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return  # an installed copy without .git: nothing to compare with
    assert environment_record(REPO)["git"]["commit"] == head.stdout.strip()
    assert isinstance(environment_record(REPO)["git"]["dirty"], bool)


def test_it_works_outside_a_repository_and_without_git(tmp_path, monkeypatch):
    assert environment_record(tmp_path)["git"] == {"commit": None, "dirty": None}
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    record = environment_record(REPO)
    assert record["git"] == {"commit": None, "dirty": None}
    json.dumps(record)


def test_missing_packages_are_none_and_cpu_model_falls_back(tmp_path):
    assert run_environment.package_version("surely-not-an-installed-distribution") is None
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 3000\n")
    assert run_environment.cpu_model(cpuinfo) == "Test CPU 3000"
    assert run_environment.cpu_model(tmp_path / "absent")  # platform's answer, never empty
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree: 1 kB\n")
    assert run_environment.total_memory_bytes(meminfo) == 16384 * 1024


def test_rlvr_fit_writes_the_record_into_the_run_log_directories(in_tmp_dir):
    cli = main(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "sort_grpo.yaml"),
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
        ]
    )
    csv_dir = Path(cli.trainer.loggers[1].log_dir)
    for directory in (Path(cli.trainer.log_dir), csv_dir):
        record = json.loads((directory / "environment.json").read_text())
        assert record["torch"]["version"] == torch.__version__
        assert record["threads"]["torch"] == 1  # the CLI's torch_threads, set before fit starts
    assert (csv_dir / "metrics.csv").is_file()  # beside the run's metrics
