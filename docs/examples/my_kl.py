"""A KL estimator in a file of its own: the absolute log-ratio."""

from rlvr_lightning.core.kl import KLEstimator


class AbsKL(KLEstimator):
    """|log pi(token) - log pi_ref(token)| per token: verl's ``kl_penalty="abs"``.

    Not an unbiased KL estimate: a penalty on how far each sampled token's log-prob moved,
    in either direction, that grows linearly rather than quadratically (k2, k3) with the move.
    """

    def __call__(self, log_probs, ref_log_probs):
        # verl core_algos.kl_penalty "abs": (logprob - ref_logprob).abs()
        return (log_probs - ref_log_probs).abs()  # [N, T]
