"""The per-token losses of supervised fine-tuning: the negative log-likelihood, and DFT's rescaled one.

Dynamic fine-tuning (DFT; Wu et al. 2025, "On the Generalization of SFT: A Reinforcement Learning Perspective
with Reward Rectification", arXiv:2508.05629) reads SFT's gradient as a policy gradient whose implicit reward is
``1 / pi(y_t)``, large on the tokens the model finds unlikely; weighting each token's NLL by its probability
(without a gradient through the weight) cancels that factor. Its gradient is that of ``-pi(y_t)``.
"""

from __future__ import annotations

from torch import Tensor

#: the per-token losses `likelihood_token_loss` computes
LIKELIHOOD_LOSSES = ("nll", "dft")


def likelihood_token_loss(log_probs: Tensor, loss: str = "nll") -> Tensor:
    """``[N, T]`` per-token loss from the target tokens' log-probabilities: ``nll`` or ``dft``."""
    if loss == "nll":
        return -log_probs
    if loss == "dft":
        # L_DFT = -sg(pi(y_t)) log pi(y_t)  (Wu et al. 2025, arXiv:2508.05629; TRL sft_trainer.dft_loss)
        return -log_probs.detach().exp() * log_probs
    raise ValueError(f"loss={loss!r} is not a likelihood loss; choose one of {list(LIKELIHOOD_LOSSES)}")
