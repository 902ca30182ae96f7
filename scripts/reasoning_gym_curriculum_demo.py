"""The difficulty curriculum on reasoning-gym datasets with a scripted learner: levels rise as the learner improves.

The learner's skill grows by `--skill_per_refresh` every refresh (as training would make it); it answers an
example of level l correctly in round(n * sigmoid(2 * (skill - l))) of its n samples (the rest wrong). Everything
else is the real path: `ReasoningGymTask` draws the candidates at the current levels, `DifficultyFilter.refresh`
samples and scores them with `ReasoningGymReward` (the datasets' own scorers), and `RLVRDataModule`'s refresh
hands the pass counts to the task, which moves each dataset's reasoning-gym levels (`CurriculumRule`).

    python scripts/reasoning_gym_curriculum_demo.py --refreshes 12 --plot docs/reasoning_gym_curriculum_toy.png
"""

from __future__ import annotations

import argparse
import math
import types

import torch

from rlvr_lightning.data import RLVRDataModule
from rlvr_lightning.data.difficulty_filter import DifficultyFilter
from rlvr_lightning.data.reasoning_gym_task import ReasoningGymTask
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import scoring
from rlvr_lightning.rewards.reasoning_gym import ReasoningGymReward
from rlvr_lightning.rollout import Rollout

DATASETS = [
    {"name": "basic_arithmetic", "config": {"operators": ["+", "-"], "allow_parentheses": False}},
    {"name": "leg_counting"},
]


class ScriptedLearner(torch.nn.Module):
    """Answers right in round(n * sigmoid(2 * (skill - level))) of n samples; `skill` is set from outside."""

    def __init__(self, skill: float = 0.0) -> None:
        super().__init__()
        self.skill = skill

    def passes(self, level: int, n: int) -> int:
        return round(n / (1 + math.exp(-2 * (self.skill - level))))

    def sample(self, batch, n, sampling) -> Rollout:
        texts, metadata = [], []
        for meta in batch["metadata"]:
            right = self.passes(meta["rg_level"], n)
            texts += [f"\\boxed{{{meta['answer']}}}" if j < right else "\\boxed{wrong}" for j in range(n)]
            metadata += [meta] * n
        rollout = Rollout.from_texts(texts, metadata=metadata)
        rollout.group_size = n
        return rollout


class ScriptedModule:
    """What the curriculum refresh needs of a training module: the policy, sampling settings, rewards."""

    def __init__(self, policy: ScriptedLearner, reward: ReasoningGymReward) -> None:
        self.policy, self.reward_callbacks = policy, [reward]
        self.sampling, self.device = SamplingConfig(), torch.device("cpu")

    def score(self, rollout):
        scoring.score(rollout, self.reward_callbacks)

    def correctness(self, rollout, kind="task"):
        return scoring.correctness(rollout, self.reward_callbacks, kind)


def scripted_trainer(module) -> types.SimpleNamespace:
    loop = types.SimpleNamespace(epoch_loop=types.SimpleNamespace(_batches_that_stepped=0))
    return types.SimpleNamespace(
        current_epoch=0, lightning_module=module, global_rank=0, world_size=1, loggers=[], is_global_zero=True,
        fit_loop=loop,
    )  # fmt: skip


def run_demo(refreshes: int = 12, skill_per_refresh: float = 0.5, candidates: int = 32, seed: int = 0) -> list[dict]:
    """One row per refresh: the learner's skill before it, and every `curriculum/<dataset>/...` stat."""
    task = ReasoningGymTask(datasets=DATASETS, num_val=0, seed=seed, curriculum={"raise_at": 0.7, "lower_at": 0.2})
    flt = DifficultyFilter(n=8, max_candidates=candidates, batch_size=candidates, min_kept=1)
    data = RLVRDataModule(task, batch_size=4, difficulty_filter=flt, seed=seed)
    learner = ScriptedLearner()
    module = ScriptedModule(learner, ReasoningGymReward(methods=["boxed"], timeout_s=None))
    data.trainer = scripted_trainer(module)
    history = []
    for refresh in range(refreshes):
        data.trainer.current_epoch = refresh
        data.trainer.fit_loop.epoch_loop._batches_that_stepped = refresh * 10
        learner.skill = refresh * skill_per_refresh
        data._maybe_refresh()
        history.append({"refresh": refresh, "skill": learner.skill, **flt.last_stats})
    return history


def plot(history: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (levels, rates) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = [row["refresh"] for row in history]
    levels.plot(x, [row["skill"] for row in history], "k:", label="learner skill")
    for spec, style in zip(DATASETS, ({"lw": 3.5, "alpha": 0.6}, {"lw": 1.5}), strict=False):
        name = spec["name"]
        series = [row[f"curriculum/{name}/level"] for row in history]
        levels.step(x, series, where="post", label=f"{name} level", **style)
        rates.plot(x, [row[f"curriculum/{name}/pass_rate"] for row in history], marker="o", label=name)
    for y in (0.7, 0.2):
        rates.axhline(y, color="grey", lw=0.8, ls="--")
    levels.set(xlabel="curriculum refresh", ylabel="level after the refresh", title="difficulty levels")
    rates.set(xlabel="curriculum refresh", ylabel="pass rate of the candidates", title="measured pass rates")
    levels.legend(fontsize=8)
    rates.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refreshes", type=int, default=12)
    parser.add_argument("--skill_per_refresh", type=float, default=0.5)
    parser.add_argument("--plot", default=None, help="write the figure here (PNG)")
    args = parser.parse_args()
    history = run_demo(args.refreshes, args.skill_per_refresh)
    for row in history:
        parts = []
        for spec in DATASETS:
            key = f"curriculum/{spec['name']}"
            parts.append(f"{spec['name']} {row[key + '/pass_rate']:.2f} -> level {row[key + '/level']:.0f}")
        levels = ", ".join(parts)
        print(f"refresh {row['refresh']:2d} skill {row['skill']:.1f}: {levels}")
    if args.plot:
        plot(history, args.plot)


if __name__ == "__main__":
    main()
