"""Run configs for one step (and one validation batch) on the emulated device of `tests/emulated_device.py`, a
stand-in for a GPU on a CPU, and list per config the operators that combined a tensor left on the CPU with the
model's device (on a GPU, each an error) or the error the run ended with. Exit status 1 if any.

    python scripts/check_configs_on_a_device.py configs/recipes/*.yaml
    RLVR_CACHE=... python scripts/check_configs_on_a_device.py configs/smollm2_demo.yaml configs/smollm2_judge.yaml

Extra `rlvr fit` options after `--` replace the defaults below (e.g. `-- --trainer.limit_train_batches=2`). A
config that starts from an earlier stage's checkpoint (`policy_from_checkpoint`) needs that file, as `rlvr fit`
does. Single-process runs only: under DDP the parameters cannot be swapped for emulated ones once the strategy
holds them (and the launched ranks run this script again).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ONTO_DEVICE = "tests.emulated_device.OntoEmulatedDevice"
ONE_STEP = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=1",
    "--trainer.limit_val_batches=1",
    "--trainer.val_check_interval=1",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.enable_progress_bar=false",
]


def check(config: str, options: list[str]) -> tuple[str, list[str]]:
    """(how the run ended, the operators that mixed devices) for one config."""
    from rlvr_lightning.cli.app import main
    from tests.emulated_device import emulated_device

    device = None
    try:
        with emulated_device() as device:
            cli = main(
                ["fit", "--config", config, *options, "--trainer.callbacks+=tests.emulated_device.OntoEmulatedDevice"]
            )
        ended = f"ok, {cli.trainer.global_step} optimizer steps"
    except BaseException as error:  # noqa: BLE001 - a failed config is a row of the table, not the end of it
        ours = [frame for frame in traceback.extract_tb(error.__traceback__) if "/rlvr_lightning/" in frame.filename]
        where = f" at {ours[-1].filename.split('rlvr_lightning/')[-1]}:{ours[-1].lineno}" if ours else ""
        ended = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}{where}"
    return ended, sorted(set(device.mixed)) if device is not None else []


def main() -> int:
    args = sys.argv[1:]
    configs, options = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, ONE_STEP)
    failed = 0
    for config in configs:
        start = time.perf_counter()
        ended, mixed = check(config, options)
        failed += bool(mixed) or not ended.startswith("ok")
        print(f"{Path(config).name:40s} {time.perf_counter() - start:6.1f} s  {ended}", flush=True)
        for line in mixed:
            print(f"{'':40s}   mixed devices: {line}", flush=True)
    print(f"{len(configs) - failed} of {len(configs)} configs ran with every tensor on the model's device")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
