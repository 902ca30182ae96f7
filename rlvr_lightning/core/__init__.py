"""Pure-tensor RL math: advantages, policy losses, aggregation, KL, log-probs, metrics.

Depends on torch only. See each module's docstring for conventions.
"""

from rlvr_lightning.core.advantage_estimators import (
    ADVANTAGE_ESTIMATORS,
    STD_SCOPES,
    batch_whitened_advantages,
    centered_advantages,
    compute_advantages,
    max_only_advantages,
    normalized_advantages,
    raw_advantages,
    rloo_advantages,
    zero_variance_group_fraction,
    zero_variance_group_mask,
)
from rlvr_lightning.core.aggregation import AGGREGATION_MODES, aggregate_loss
from rlvr_lightning.core.entropy import entropy_from_log_probs, entropy_from_logits
from rlvr_lightning.core.kl import KL_ESTIMATORS, kl_estimate
from rlvr_lightning.core.log_probs import token_log_probs_from_logits
from rlvr_lightning.core.masked import masked_mean, masked_normalize, masked_sum, masked_var
from rlvr_lightning.core.pass_at_k import pass_at_k, pass_at_k_tensor
from rlvr_lightning.core.policy_losses import (
    POLICY_LOSS_OPTIONS,
    POLICY_LOSSES,
    PolicyLossOutput,
    compute_policy_loss,
    cispo_loss,
    gspo_loss,
    importance_ratio_loss,
    merged_stats,
    naive_pg_loss,
    ppo_clip_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "POLICY_LOSS_OPTIONS",
    "STD_SCOPES",
    "PolicyLossOutput",
    "aggregate_loss",
    "batch_whitened_advantages",
    "centered_advantages",
    "cispo_loss",
    "compute_advantages",
    "compute_policy_loss",
    "entropy_from_log_probs",
    "entropy_from_logits",
    "gspo_loss",
    "importance_ratio_loss",
    "kl_estimate",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "masked_var",
    "max_only_advantages",
    "merged_stats",
    "naive_pg_loss",
    "normalized_advantages",
    "pass_at_k",
    "pass_at_k_tensor",
    "ppo_clip_loss",
    "raw_advantages",
    "rloo_advantages",
    "token_log_probs_from_logits",
    "zero_variance_group_fraction",
    "zero_variance_group_mask",
]
