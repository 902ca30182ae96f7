"""DCPO's smooth standardization in a run: each prompt's statistics kept across steps and epochs, known by its
tokens, a prompt twice in one step folded in order, the statistics in checkpoints, the same on every rank."""

import pytest
import torch

from rlvr_lightning.advantages import SmoothStandardizedAdvantage
from rlvr_lightning.core.smooth_standardization import PromptRewardStats, smooth_standardized_advantages
from rlvr_lightning.rollout import Rollout
from tests.ddp_runs import fit_two_ranks

from .prompt_pool import pool_ddp_config, pool_fit, rollout_of


class Reference:
    """The pure function over one prompt at a time, with its own store keyed by the prompt's tokens."""

    def __init__(self):
        self.stats = {}

    def advantages(self, rollout: Rollout) -> torch.Tensor:
        out = []
        for group in range(rollout.num_groups):
            rows = slice(group * rollout.group_size, (group + 1) * rollout.group_size)
            key = tuple(rollout.prompt_ids[rows.start][rollout.prompt_mask[rows.start].bool()].tolist())
            mean, std, visits = self.stats.get(key, (0.0, 0.0, 0))
            prior = PromptRewardStats(*(torch.tensor([v], dtype=torch.float64) for v in (mean, std, visits)))
            values, after = smooth_standardized_advantages(rollout.reward[rows].double(), rollout.group_size, prior)
            self.stats[key] = (after.mean.item(), after.std.item(), int(after.visits))
            out.append(values.float())
        return torch.cat(out)


def test_a_run_standardizes_each_prompt_by_all_its_groups_across_epochs(in_tmp_dir):
    estimator = SmoothStandardizedAdvantage()
    module, trainer = pool_fit(estimator, group_size=4, loss="dynamic_clip")
    reference = Reference()
    assert len(module.trained_on) == 8
    for rollout in module.trained_on:
        assert torch.allclose(rollout.advantages, reference.advantages(rollout), atol=1e-6)
    assert len(estimator.stats) == len(reference.stats) == 8  # one entry per prompt of the pool
    assert sum(visits for _, _, visits in estimator.stats.values()) == 8 * 4  # every group counted once
    assert trainer.callback_metrics["train/sas/revisited_frac"] == 1.0  # the last epoch's prompts were all seen
    assert not any(torch.isnan(rollout.advantages).any() for rollout in module.trained_on)


def test_a_prompt_twice_in_one_step_is_folded_in_order_and_padding_does_not_change_it():
    together = SmoothStandardizedAdvantage()
    both = together.compute(rollout_of([[1, 2], [3, 4], [1, 2]], [1, 0, 0, 0, 1, 1, 0, 1, 1], group_size=3))
    apart = SmoothStandardizedAdvantage()
    first = apart.compute(rollout_of([[1, 2], [3, 4]], [1, 0, 0, 0, 1, 1], group_size=3))
    second = apart.compute(rollout_of([[1, 2]], [0, 1, 1], group_size=3, pad=2))  # left padding: the same prompt
    assert torch.allclose(both, torch.cat([first, second]))
    assert together.stats == apart.stats and len(together.stats) == 2
    assert together.step_metrics() == {"train/sas/revisited_frac": pytest.approx(1 / 3)}
    # the second group's advantages are not the first visit's GRPO ones: its prompt had been answered
    grpo = smooth_standardized_advantages(torch.tensor([0.0, 1, 1]), 3, PromptRewardStats(*torch.zeros(3, 1)))[0]
    assert not torch.allclose(second, grpo)


def test_the_statistics_survive_a_checkpoint():
    estimator = SmoothStandardizedAdvantage()
    estimator.compute(rollout_of([[1, 2], [3, 4]], [1, 0, 0, 0, 1, 1], group_size=3))
    restored = SmoothStandardizedAdvantage()
    restored.load_state_dict(torch.load(_saved(estimator.state_dict()), weights_only=True))
    step = rollout_of([[3, 4], [1, 2]], [1, 1, 1, 0, 0, 1], group_size=3)
    assert torch.equal(restored.compute(step), estimator.compute(step))
    assert restored.stats == estimator.stats


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


RECORDER = """
import json
import lightning.pytorch as pl
import torch
torch.set_num_threads(1)

class StatsRecorder(pl.Callback):
    def __init__(self, out: str):
        self.out = out
    def on_train_end(self, trainer, pl_module):
        stats = pl_module.advantage_estimator.stats
        json.dump({"stats": {key: list(value) for key, value in stats.items()}},
                  open(f"{self.out}/rank{trainer.global_rank}.json", "w"))
"""


def test_every_rank_holds_the_statistics_of_every_ranks_groups(tmp_path):
    estimator = "{class_path: rlvr_lightning.advantages.SmoothStandardizedAdvantage}"
    config = pool_ddp_config(tmp_path, estimator, "stats_recorder.StatsRecorder", 4, "    loss: dynamic_clip\n")
    records = fit_two_ranks(tmp_path, "stats_recorder", RECORDER, config)
    assert records[0]["stats"] == records[1]["stats"]
    # 3 epochs of 8 prompts, split between the ranks: every group of both ranks counted once
    assert sum(visits for _, _, visits in records[0]["stats"].values()) == 3 * 8
