"""scripts/bench_overhead.py: the plain loop it runs alongside a fit must not change the fit."""

from pathlib import Path

import torch

from rlvr_lightning.cli.app import main as rlvr_cli
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


def lecture_fit(steps: int, callbacks: list) -> tuple[float, torch.Tensor]:
    cli = rlvr_cli(
        [
            "--config",
            str(REPO / "configs" / "sort_lecture.yaml"),
            f"--trainer.limit_train_batches={steps}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
        ],
        run=False,
    )
    cli.trainer.callbacks.extend(callbacks)
    cli.trainer.fit(cli.model, cli.datamodule)
    parameters = torch.cat([p.detach().flatten() for p in cli.model.policy.parameters()])
    return float(cli.trainer.callback_metrics["train/reward_mean"]), parameters


def test_paired_plain_loop_leaves_the_run_unchanged_and_times_both(in_tmp_dir):
    bench = load_script("bench_overhead")
    paired = bench.PairedPlainLoop(seed=0, block=5)
    reward, parameters = lecture_fit(12, [paired])
    alone_reward, alone_parameters = lecture_fit(12, [])
    assert reward == alone_reward
    assert torch.equal(parameters, alone_parameters)
    assert paired.plain_steps == len(paired.plain_times) == 10  # two blocks of 5 after batches 5 and 10
    assert len(paired.run_times) == 11  # batch ends 2..12, each timed from the previous one


def test_paired_plain_loop_is_the_plain_loop(in_tmp_dir):
    """Its steps are the plain loop's steps: same seed, same rewards as running them on their own."""
    bench = load_script("bench_overhead")
    paired = bench.PairedPlainLoop(seed=0, block=3)
    torch.manual_seed(123)  # the surrounding run's stream must not matter
    for batch_idx in range(3):  # the third batch end runs a block of 3 plain steps
        paired.on_train_batch_end(None, None, None, None, batch_idx)
    assert paired.plain_steps == 3
    paired_reward = paired.plain_reward
    lecture = bench.LectureStep(seed=0)
    optimizer = torch.optim.Adam(lecture.policy.parameters(), lr=bench.LR)
    rewards = [lecture(step, torch.randint(0, bench.V, (bench.PROMPTS, bench.L)), optimizer) for step in range(3)]
    assert paired_reward == rewards[-1]
