"""`MixedAdvantage`: MAPO's advantage, GRPO's and the percent deviation mixed by how certain each group is."""

from __future__ import annotations

from typing import Annotated

from torch import Tensor

from rlvr_lightning.advantages.callbacks import CorrectnessAdvantage
from rlvr_lightning.core import advantage_estimators as estimators
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, Range


@documented_options
class MixedAdvantage(CorrectnessAdvantage):
    """MAPO (Huang et al. 2025, "MAPO: Mixed Advantage Policy Optimization", arXiv:2509.18849):

        A = (1 - lambda(p)) (r - mean) / (std + eps) + lambda(p) (r - mean) / (mean + eps),  lambda(p) = 1 - 4 p (1 - p)

    with `p` the share of the group's responses that are correct. GRPO's std normalisation gives a group solved 1 in
    8 times and one solved 7 in 8 times mirror-image advantages (+-2.47 and -+0.35), and a group that is nearly all
    right or all wrong advantages as large as an even one's; the advantage percent deviation weighs the deviation by
    the mean instead (a rare success counts 7 times the mean, a rare failure minus once), and the mix takes it where
    the group is certain (p near 0 or 1) and GRPO's where it is not (p = 1/2). Correctness is the task reward's
    ``is_correct``, or with ``correct_at`` a total reward at least that high (the authors' code counts the rewards
    equal to 1). Groups whose rewards are equal get 0.
    """

    min_group_size = 2

    def __init__(
        self,
        eps: Annotated[float, Option("added to the std and to the mean.", NON_NEGATIVE)] = 1e-6,
        correct_at: Annotated[
            float | None,
            Option("a response whose reward is at least this is correct (null: is_correct).", Range(optional=True)),
        ] = None,
    ) -> None:
        check_options(MixedAdvantage, locals())
        self.eps, self.correct_at = eps, correct_at

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.mixed_advantages(rollout.reward, self.correct(rollout), rollout.group_size, eps=self.eps)
