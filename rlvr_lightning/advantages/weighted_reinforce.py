"""`WeightedReinforceAdvantage`: W-REINFORCE's advantages, from whether each response is correct."""

from __future__ import annotations

from typing import Annotated

from torch import Tensor

from rlvr_lightning.advantages.callbacks import CorrectnessAdvantage
from rlvr_lightning.core import advantage_estimators as estimators
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, Range

FINITE_OR_NULL = Range(optional=True)


@documented_options
class WeightedReinforceAdvantage(CorrectnessAdvantage):
    """A = lambda for a correct response, -1 for a wrong one: W-REINFORCE (Zhu et al. 2025, "The Surprising
    Effectiveness of Negative Reinforcement in LLM Reasoning", arXiv:2506.01347).

    REINFORCE on rewards of +-1 without a baseline, the correct responses' weight lowered to lambda: pushing the
    wrong responses down moves probability to the model's other candidates, which keeps its pass@k. Correctness is
    the task reward's ``is_correct`` (a run without such a reward is refused at its first step), or with
    ``correct_at`` a total reward at least that high (for graded rewards). ``positive_weight: 1`` is REINFORCE on
    +-1 rewards; 0 is negative sample reinforcement alone (NSR), except that the correct responses stay in the
    loss's divisor, where the authors' code drops them from the batch.
    """

    def __init__(
        self,
        positive_weight: Annotated[
            float, Option("lambda, the advantage of a correct response (the authors recommend 0.1).", NON_NEGATIVE)
        ] = 0.1,
        correct_at: Annotated[
            float | None,
            Option("a response whose reward is at least this is correct (null: is_correct).", FINITE_OR_NULL),
        ] = None,
    ) -> None:
        check_options(WeightedReinforceAdvantage, locals())
        self.positive_weight, self.correct_at = positive_weight, correct_at

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.weighted_reinforce_advantages(self.correct(rollout), self.positive_weight)
