"""Policy and value losses: `PolicyLoss` objects that own their hyper-parameters and return an unaggregated
`[N, T]` loss. A recipe names one as `rlvr_lightning.core.losses.<Name>` under `model.init_args.loss`."""

from rlvr_lightning.core.losses.policy_losses import (
    CISPO,
    GSPO,
    LUSPO,
    POLICY_LOSSES,
    SAPO,
    VESPO,
    ImportanceRatio,
    PolicyGradient,
    PolicyLoss,
    PolicyLossOutput,
    PPOClip,
    policy_loss,
)

__all__ = [
    "CISPO",
    "GSPO",
    "LUSPO",
    "POLICY_LOSSES",
    "SAPO",
    "VESPO",
    "ImportanceRatio",
    "PPOClip",
    "PolicyGradient",
    "PolicyLoss",
    "PolicyLossOutput",
    "policy_loss",
]
