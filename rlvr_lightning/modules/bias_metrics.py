"""GRPO's length and difficulty biases, logged every rollout step (`core/bias_diagnostics.py`).

    train/bias/length_correct, length_incorrect     mean response length (tokens) by correctness; NaN when the
                                                    step has none (needs a reward that tells correctness)
    train/bias/group_reward_std_q10, _q50, _q90     quantiles of the per-group reward std (group_size >= 2)
    train/bias/token_weight_long, _short,           per-token weight the module's `aggregation` gives the longer
               token_weight_long_over_short         and the shorter half of the responses (token-mean = 1)

Measured on the batch that is trained on (after dynamic sampling), before any KL shaping of the reward.
"""

from __future__ import annotations

from torch import Tensor

from rlvr_lightning.core.bias_diagnostics import group_std_quantiles, length_by_correctness, long_short_token_weights
from rlvr_lightning.modules.aggregation_options import AggregationConfig
from rlvr_lightning.rollout import Rollout


def bias_metrics(
    rollout: Rollout,
    correct: Tensor | None,
    aggregation: AggregationConfig,
    loss_constant: float,
    prefix: str = "train/bias",
) -> dict[str, Tensor]:
    """The diagnostics of `rollout`.

    Args:
        rollout: the scored batch that is trained on.
        correct: `bool[N]`, which responses are correct (None: no reward tells; no length by correctness).
        aggregation: the module's aggregation, whose per-token weights are compared.
        loss_constant: the divisor of aggregation modes seq-sum-constant and delta-l.
        prefix: the metrics' prefix.
    """
    metrics: dict[str, Tensor] = {}
    if correct is not None:
        metrics.update(length_by_correctness(rollout.response_mask, correct))
    if rollout.group_size >= 2 and rollout.num_rows % rollout.group_size == 0 and rollout.num_rows:
        metrics.update(group_std_quantiles(rollout.reward, rollout.group_size))
    if rollout.num_rows >= 2:
        metrics.update(
            long_short_token_weights(
                rollout.response_mask,
                aggregation.mode,
                loss_constant,
                aggregation.count_empty_rows,
                rollout.group_index,
                aggregation.alpha,
            )
        )
    return {f"{prefix}/{key}": value for key, value in metrics.items()}
