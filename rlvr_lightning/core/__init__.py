"""Pure-tensor RL math: advantages, policy losses, aggregation, KL, log-probs, metrics.

Depends on torch only. See each module's docstring for conventions.
"""

from rlvr_lightning.core.advantage_estimators import (
    STD_SCOPES,
    batch_whitened_advantages,
    centered_advantages,
    length_weighted_centered_advantages,
    max_only_advantages,
    normalized_advantages,
    raw_advantages,
    rloo_advantages,
    zero_variance_group_fraction,
    zero_variance_group_mask,
)
from rlvr_lightning.core.aggregation import AGGREGATION_MODES, aggregate_loss
from rlvr_lightning.core.entropy import entropy_from_log_probs, entropy_from_logits
from rlvr_lightning.core.kl import K1, K2, K3, K3IS, KL_ESTIMATORS, KLEstimator, kl_estimator
from rlvr_lightning.core.log_probs import token_log_probs_from_logits
from rlvr_lightning.core.losses.policy_losses import (
    CISPO,
    DPPO,
    GMPO,
    GSPO,
    LUSPO,
    POLICY_LOSSES,
    SAPO,
    VESPO,
    ClipCov,
    HighEntropyTokens,
    ImportanceRatio,
    KLCov,
    PolicyGradient,
    PolicyLoss,
    PolicyLossOutput,
    PPOClip,
    merged_stats,
    policy_loss,
)
from rlvr_lightning.core.masked import masked_mean, masked_normalize, masked_sum, masked_var
from rlvr_lightning.core.pass_at_k import pass_at_k, pass_at_k_tensor

__all__ = [
    "ClipCov",
    "HighEntropyTokens",
    "KLCov",
    "AGGREGATION_MODES",
    "CISPO",
    "DPPO",
    "GMPO",
    "GSPO",
    "K1",
    "K2",
    "K3",
    "K3IS",
    "KL_ESTIMATORS",
    "LUSPO",
    "POLICY_LOSSES",
    "SAPO",
    "STD_SCOPES",
    "VESPO",
    "ImportanceRatio",
    "KLEstimator",
    "PPOClip",
    "PolicyGradient",
    "PolicyLoss",
    "PolicyLossOutput",
    "aggregate_loss",
    "batch_whitened_advantages",
    "centered_advantages",
    "length_weighted_centered_advantages",
    "entropy_from_log_probs",
    "entropy_from_logits",
    "kl_estimator",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "masked_var",
    "max_only_advantages",
    "merged_stats",
    "normalized_advantages",
    "pass_at_k",
    "pass_at_k_tensor",
    "policy_loss",
    "raw_advantages",
    "rloo_advantages",
    "token_log_probs_from_logits",
    "zero_variance_group_fraction",
    "zero_variance_group_mask",
]
