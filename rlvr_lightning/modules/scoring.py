"""Scoring rollouts with a run's reward callbacks, as every module that samples does (RL, SFT, expert iteration).

`score` fills a rollout's rewards and `reward_metrics` summarises them; `correctness` decides which
responses are correct (or well-formatted) from the first reward of a kind that can tell; `completion_rows`
turns a scored rollout into plain rows for `rlvr predict`. `PolicyModule` (`modules/policy_module.py`) calls
them with its `reward_callbacks`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlvr_lightning.core.advantage_estimators import zero_variance_group_fraction
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout


def score(rollout: Rollout, reward_callbacks: Sequence[RewardCallback]) -> None:
    """Fill `rollout.rewards` (unweighted, by name), `rollout.reward` (weighted sum) and, where a reward says more
    than its number, `rollout.feedback`."""
    total = torch.zeros(rollout.num_rows, device=rollout.response_ids.device)
    notes: list[list[str]] = [[] for _ in range(rollout.num_rows)]
    for callback in reward_callbacks:
        scores = callback(rollout)
        rollout.rewards[callback.name] = scores
        total = total + callback.weight * scores
        for row, note in enumerate(callback.feedback(rollout, scores) or []):
            if note:
                notes[row].append(note)
    rollout.reward = total
    if any(notes):  # what the rewards said of each response, one line per reward (SDPO's environment feedback)
        rollout.feedback = ["\n".join(row) if row else None for row in notes]


def correctness(rollout: Rollout, reward_callbacks: Sequence[RewardCallback], kind: str = "task") -> Tensor | None:
    """`bool[N]` from the first reward of this `kind` that can tell whether a response satisfies it."""
    for callback in reward_callbacks:
        if callback.kind == kind:
            correct = callback.is_correct(rollout, rollout.rewards[callback.name])
            if correct is not None:
                return correct
    return None


def correct_rows(correct: Tensor | None, rollout: Rollout, estimator, loss=None) -> Tensor:
    """`correct` on the rollout's device, for the update, an advantage estimator or a loss that reads which responses
    are correct (VAPO's positive-example loss, W-REINFORCE, SimKO); an error that names the reader when no reward can
    tell."""
    if correct is None:
        readers = [r for r in (estimator, loss) if getattr(r, "reads_correctness", False)]
        reader = type(readers[0]).__name__ if readers else None
        what = reader or "positive_nll_coef > 0"
        raise ValueError(
            f"{what} trains on which responses are correct, but no reward can tell a correct one (is_correct "
            f"returned None): add the task's reward (MathAccuracyReward, ...)"
            + ("" if reader else " or set positive_nll_coef 0")
        )
    return correct.to(rollout.response_mask.device)


def final_answers(rollout: Rollout, reward_callbacks: Sequence[RewardCallback]) -> list[str | None] | None:
    """The answers the first task reward that can extract them reads from the responses (majority vote)."""
    for callback in reward_callbacks:
        if callback.kind == "task":
            answers = callback.extract_answers(rollout)
            if answers is not None:
                return answers
    return None


def per_reward_metrics(
    rollout: Rollout, reward_callbacks: Sequence[RewardCallback], prefix: str
) -> dict[str, Tensor | float]:
    """Each reward's mean (`{prefix}/rewards/<name>`), what else it measured (`{prefix}/rewards/<name>/<key>`,
    `RewardCallback.pop_metrics`) and the rows it failed on since the last call
    (`{prefix}/reward_errors/<name>`); the rows of all rewards not scored within their time limit
    (`{prefix}/reward_errors/timeout`, among the failures)."""
    metrics: dict[str, Tensor | float] = {}
    timeouts = 0
    for callback in reward_callbacks:
        metrics[f"{prefix}/rewards/{callback.name}"] = rollout.rewards[callback.name].mean()
        metrics.update({f"{prefix}/rewards/{callback.name}/{key}": v for key, v in callback.pop_metrics().items()})
        timeouts += callback.num_timeouts
        metrics[f"{prefix}/reward_errors/{callback.name}"] = float(callback.pop_errors())
    metrics[f"{prefix}/reward_errors/timeout"] = float(timeouts)
    return metrics


def reward_metrics(
    rollout: Rollout, reward_callbacks: Sequence[RewardCallback], generation_stats: dict | None, prefix: str
) -> dict[str, Tensor | float]:
    """The total reward's statistics, each reward's (`per_reward_metrics`) and the generation's statistics."""
    reward = rollout.reward
    metrics: dict[str, Tensor | float] = {
        f"{prefix}/reward_mean": reward.mean(),
        f"{prefix}/reward_std": reward.std() if reward.numel() > 1 else 0.0,
        f"{prefix}/reward_min": reward.min(),
        f"{prefix}/reward_max": reward.max(),
        f"{prefix}/zero_variance_groups": zero_variance_group_fraction(reward, rollout.group_size),
    }
    metrics.update(per_reward_metrics(rollout, reward_callbacks, prefix))
    if generation_stats:
        metrics.update({f"{prefix}/generation/{key}": float(value) for key, value in generation_stats.items()})
    return metrics


def completion_rows(rollout: Rollout, correct: Tensor | None = None) -> list[dict]:
    """One plain dict per row: prompt and completion (text, or token ids without padding), rewards, correctness."""
    prompt_ids, response_ids = rollout.prompt_ids.cpu(), rollout.response_ids.cpu()
    prompt_mask, response_mask = rollout.prompt_mask.bool().cpu(), rollout.response_mask.bool().cpu()
    rewards = {name: values.tolist() for name, values in rollout.rewards.items()}
    totals = rollout.reward.tolist() if rollout.reward is not None else [None] * rollout.num_rows
    rows = []
    for i in range(rollout.num_rows):
        rows.append(
            {
                "prompt": rollout.prompt_text[i] if rollout.prompt_text else prompt_ids[i][prompt_mask[i]].tolist(),
                "completion": rollout.response_text[i]
                if rollout.response_text
                else response_ids[i][response_mask[i]].tolist(),
                "reward": totals[i],
                "rewards": {name: values[i] for name, values in rewards.items()},
                "correct": None if correct is None else bool(correct[i]),
                "truncated": bool(rollout.truncated[i]),
                "metadata": rollout.metadata[i] if rollout.metadata else {},
            }
        )
    return rows
