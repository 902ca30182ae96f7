"""`AdvantageCallback`: turns a rollout's rewards into advantages. Exactly one per run.

Each class is a thin wrapper over an estimator in `rlvr_lightning.core.advantage_estimators`; the
module finds the callback in `trainer.callbacks` (GRPO's normalised advantage when none is
configured). A new estimator is one subclass overriding `compute`.
"""

from __future__ import annotations

from typing import Annotated

import torch
from lightning.pytorch import Callback
from torch import Tensor

from rlvr_lightning.core import advantage_estimators as estimators
from rlvr_lightning.core.pass_at_k import PASS_AT_K_BASELINES, pass_at_k_advantages
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import FINITE, NON_NEGATIVE, PROBABILITY, OneOf, Range


class AdvantageCallback(Callback):
    """Base class: `compute(rollout) -> float[N]` (outcome advantages) or `float[N, T]` (per token)."""

    #: smallest group size the estimator is defined for (checked at start-up)
    min_group_size: int = 1
    #: the estimator reads `rollout.token_energy` (the module fills it from `Policy.logit_statistics`)
    reads_token_energy: bool = False
    #: the estimator reads `rollout.greedy_reward` (the module samples a greedy response to each prompt and scores it)
    reads_greedy_reward: bool = False
    #: the estimator reads `rollout.correct` (the module asks the rewards' `is_correct`)
    reads_correctness: bool = False
    #: what the estimator reads of each prompt of the step's batch (None: nothing), so that the trained rollout
    #: must hold those prompts, in order: no dynamic sampling, no asynchronous rollouts (checked at start-up)
    reads_step_batch: str | None = None

    def compute(self, rollout: Rollout) -> Tensor:
        raise NotImplementedError

    def step_metrics(self) -> dict[str, float]:
        """What the last `compute` measured, logged with the step's metrics (names under ``train/``)."""
        return {}

    def check_group_size(self, group_size: int) -> None:
        if group_size < self.min_group_size:
            raise ValueError(
                f"{type(self).__name__} needs group_size >= {self.min_group_size} "
                f"(it compares responses to the same prompt), got group_size={group_size}"
            )


class CorrectnessAdvantage(AdvantageCallback):
    """Base of the estimators that read which responses are correct: the task reward's ``is_correct``, or with
    ``correct_at`` set, a total reward at least that high (for graded rewards)."""

    correct_at: float | None = None

    @property
    def reads_correctness(self) -> bool:
        return self.correct_at is None

    def correct(self, rollout: Rollout) -> Tensor:
        correct = rollout.correct if self.correct_at is None else rollout.reward >= self.correct_at
        if correct is None:
            raise ValueError(f"{type(self).__name__} needs rollout.correct (which responses are correct)")
        return correct


class RawRewardAdvantage(AdvantageCallback):
    """A = r: REINFORCE without a baseline."""

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.raw_advantages(rollout.reward, rollout.group_size)


#: ``GroupNormalizedAdvantage.quantile``: strictly between 0 and 1, or null
QUANTILE = Range(0, 1, low_open=True, high_open=True, optional=True)
QUANTILE_METHODS = estimators.QUANTILE_METHODS
#: ``CenteredAdvantage.baseline``: the group's mean, or its mean weighted by the responses' lengths (OPO)
CENTERED_BASELINES = ("mean", "length_weighted")
SCALE_BY_VALID_GROUPS_HELP = (
    "multiply every advantage by B / (B - M), M the responses of groups whose rewards all agree (GPG's alpha)."
)


def _scaled_by_valid_groups(advantages: Tensor, rollout: Rollout) -> Tensor:
    return advantages * estimators.valid_group_scale(rollout.reward, rollout.group_size).to(advantages)


@documented_options
class CenteredAdvantage(AdvantageCallback):
    """A = r - mean(group): Dr. GRPO; the lecture's "centered_rewards".

    ``baseline="length_weighted"`` weighs each response's reward by its length in the group's mean: OPO's
    optimal baseline (Hao et al. 2025; verl's ``opo``), meant for exactly on-policy training (one optimizer
    step per rollout). ``scale_by_valid_groups`` is GPG's alpha (Chu et al. 2025; see GroupNormalizedAdvantage).

    ``baseline_shift`` adds delta V to the baseline: AsymRE (Arnal et al. 2025, arXiv:2506.20520), whose REINFORCE
    with a baseline a little below the group's mean (delta V = -0.1 for rewards of +-1) stays stable off-policy,
    where one at or above it collapses. Every advantage moves by ``-baseline_shift``, a group whose rewards agree
    included.
    """

    min_group_size = 2

    def __init__(
        self,
        baseline: Annotated[
            str, Option("mean (Dr. GRPO) or length_weighted (OPO).", OneOf(CENTERED_BASELINES))
        ] = "mean",
        scale_by_valid_groups: Annotated[bool, Option(SCALE_BY_VALID_GROUPS_HELP)] = False,
        baseline_shift: Annotated[
            float, Option("added to the baseline: A = r - (baseline + shift) (AsymRE's delta V, e.g. -0.1).", FINITE)
        ] = 0.0,
    ) -> None:
        check_options(CenteredAdvantage, locals())
        self.baseline = baseline
        self.scale_by_valid_groups = scale_by_valid_groups
        self.baseline_shift = baseline_shift

    def compute(self, rollout: Rollout) -> Tensor:
        if self.baseline == "length_weighted":
            lengths = rollout.response_mask.sum(dim=-1)
            advantages = estimators.length_weighted_centered_advantages(rollout.reward, lengths, rollout.group_size)
            advantages = advantages - self.baseline_shift
        else:
            advantages = estimators.centered_advantages(rollout.reward, rollout.group_size, self.baseline_shift)
        return _scaled_by_valid_groups(advantages, rollout) if self.scale_by_valid_groups else advantages


@documented_options
class GroupNormalizedAdvantage(AdvantageCallback):
    """A = (r - mean(group)) / (std + eps): GRPO. `std_scope="batch"` scales by the batch std instead (Lite PPO).

    `quantile: K` takes the group's K-quantile of the rewards as the baseline instead of its mean: QAE (Wu et al.
    2025, arXiv:2509.22611; K = 0.4 there). With 0/1 rewards the baseline is 0 for a prompt solved at most 1 - K of
    the time, so only its correct responses get a (positive) advantage, and 1 above that, so only the wrong ones get
    a (negative) one. `quantile_method="inverted_cdf"` is the paper's quantile (the smallest reward with at least
    K of the group at or below it); `"linear"` interpolates between ranks, as the authors' code (`torch.quantile`).

    `scale_by_valid_groups` multiplies every advantage by GPG's alpha (Chu et al. 2025, arXiv:2504.02546), the
    inverse share of the responses whose group's rewards differ: under a token-mean loss the groups without
    signal no longer dilute the gradient. As the GPG code (which divides its loss by that share); verl's ``gpg``
    estimator divides by the number of non-zero rewards instead.
    """

    min_group_size = 2

    def __init__(
        self,
        eps: Annotated[float, Option("added to the std.", NON_NEGATIVE)] = 1e-6,
        unbiased_std: bool = True,
        std_scope: str = "group",
        scale_by_valid_groups: Annotated[bool, Option(SCALE_BY_VALID_GROUPS_HELP)] = False,
        quantile: Annotated[
            float | None,
            Option("the group's quantile of the rewards as the baseline (QAE's K; null: the mean).", QUANTILE),
        ] = None,
        quantile_method: Annotated[
            str, Option("inverted_cdf (the QAE paper's) or linear (torch.quantile's).", OneOf(QUANTILE_METHODS))
        ] = "inverted_cdf",
    ) -> None:
        check_options(GroupNormalizedAdvantage, locals())
        self.eps = eps
        self.unbiased_std = unbiased_std
        self.std_scope = std_scope
        self.scale_by_valid_groups = scale_by_valid_groups
        self.quantile, self.quantile_method = quantile, quantile_method
        estimators.normalized_advantages(Tensor([0.0, 1.0]), 2, std_scope=std_scope)  # validates std_scope now

    def compute(self, rollout: Rollout) -> Tensor:
        advantages = estimators.normalized_advantages(
            rollout.reward,
            rollout.group_size,
            eps=self.eps,
            unbiased_std=self.unbiased_std,
            std_scope=self.std_scope,
            quantile=self.quantile,
            quantile_method=self.quantile_method,
        )
        return _scaled_by_valid_groups(advantages, rollout) if self.scale_by_valid_groups else advantages


@documented_options
class NormalizeThenSumAdvantage(AdvantageCallback):
    """GDPO: each reward normalised within its group, then the weighted sum normalised over the batch.

    With several rewards, GRPO normalises their weighted sum, so a reward of large spread drowns the others;
    here each reward counts by its weight whatever its scale (TRL's ``multi_objective_aggregation=
    "normalize_then_sum"``, verl's ``gdpo``).

    Args:
        weights: each reward's weight by its name (``rollout.rewards``; a reward left out weighs 0); null: the
            reward callbacks' own weights, those of the total reward.
    """

    min_group_size = 2

    def __init__(
        self,
        weights: dict[str, float] | None = None,
        eps: Annotated[float, Option("added to every std (TRL: 1e-4).", NON_NEGATIVE)] = 1e-4,
    ) -> None:
        check_options(NormalizeThenSumAdvantage, locals())
        self.weights, self.eps = weights, eps
        self.reward_weights: dict[str, float] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.reward_weights = {cb.name: cb.weight for cb in trainer.callbacks if isinstance(cb, RewardCallback)}
        unknown = sorted(set(self.weights or {}) - set(self.reward_weights))
        if unknown:
            raise ValueError(
                f"NormalizeThenSumAdvantage: weights names {unknown}, not rewards of this run "
                f"{sorted(self.reward_weights)}"
            )
        kl = getattr(pl_module, "kl", None)
        if kl is not None and kl.mode == "reward" and kl.coef > 0:
            raise ValueError(
                "NormalizeThenSumAdvantage normalises each reward callback's scores: kl.mode='reward' would "
                "subtract the KL penalty from the total it does not read; use kl.mode='loss'"
            )

    def weight(self, name: str) -> float:
        if self.weights is not None:
            return self.weights.get(name, 0.0)
        return self.reward_weights.get(name, 1.0)

    def compute(self, rollout: Rollout) -> Tensor:
        names = list(rollout.rewards)
        rewards = torch.stack([rollout.rewards[name] for name in names], dim=1)
        weights = torch.tensor([self.weight(name) for name in names], device=rewards.device)
        return estimators.normalize_then_sum_advantages(rewards, weights, rollout.group_size, eps=self.eps)


@documented_options
class PassAtKAdvantage(AdvantageCallback):
    """Pass@k training: each response is credited with its share of its group's best-of-``k`` reward
    (`core/pass_at_k.py` ``pass_at_k_advantages``), so a group is rewarded for solving the prompt once in ``k``
    tries rather than on average.

    Args:
        k: responses per draw; ``baseline="mean"`` needs ``k < group_size``, ``"leave_one_out"`` ``2 <= k`` (null:
            the group size).
        baseline: ``mean`` (Chen et al. 2025's analytical pass@k advantage) or ``leave_one_out`` (what a response
            adds to a draw; with ``k`` = the group size, verl's ``grpo_passk``).
    """

    min_group_size = 2

    def __init__(
        self,
        k: int | None = 4,
        baseline: str = "mean",
        eps: Annotated[float, Option("added to the std.", NON_NEGATIVE)] = 1e-6,
    ) -> None:
        if baseline not in PASS_AT_K_BASELINES:
            raise ValueError(f"baseline={baseline!r} is not valid; choose one of {list(PASS_AT_K_BASELINES)}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"k={k!r} is not valid; choose an integer >= 1 (or null: the group size)")
        check_options(PassAtKAdvantage, locals())
        self.k, self.baseline, self.eps = k, baseline, eps

    def check_group_size(self, group_size: int) -> None:
        super().check_group_size(group_size)
        pass_at_k_advantages(torch.zeros(group_size), group_size, self.k or group_size, self.baseline)  # k fits

    def compute(self, rollout: Rollout) -> Tensor:
        k = self.k or rollout.group_size
        return pass_at_k_advantages(rollout.reward, rollout.group_size, k, self.baseline, self.eps)


class MaxOnlyAdvantage(AdvantageCallback):
    """Only the group's best responses keep their reward (CS336 lecture 17, "max_rewards")."""

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.max_only_advantages(rollout.reward, rollout.group_size)


class GreedyBaselineAdvantage(AdvantageCallback):
    """A = r - r(greedy response to the same prompt): ReMax (Li et al. 2023, arXiv:2310.10505; verl ``remax``).

    Each training step also decodes one greedy response to each of its prompts and scores it with the run's rewards
    (``train/greedy_reward_mean``); its reward is the baseline of every sampled response to that prompt. It needs
    the step's rollout to be its batch's prompts: no dynamic sampling, no asynchronous rollouts."""

    reads_greedy_reward = True
    reads_step_batch = "decodes a greedy response to each prompt of the step's batch"

    def compute(self, rollout: Rollout) -> Tensor:
        if rollout.greedy_reward is None:
            raise ValueError("GreedyBaselineAdvantage needs rollout.greedy_reward (a greedy response per prompt)")
        return estimators.greedy_baseline_advantages(rollout.reward, rollout.greedy_reward)


class RLOOAdvantage(AdvantageCallback):
    """A = r - mean of the other responses to the same prompt (RLOO)."""

    min_group_size = 2

    def compute(self, rollout: Rollout) -> Tensor:
        return estimators.rloo_advantages(rollout.reward, rollout.group_size)


WHITEN_SCOPES = ("response", "token")
#: ``BatchWhitenedAdvantage.baseline``: none (REINFORCE++) or each group's mean (REINFORCE++-baseline)
BASELINES = ("none", "group_mean")


@documented_options
class BatchWhitenedAdvantage(AdvantageCallback):
    """A = (r - mean(batch)) / (std(batch) + eps): REINFORCE++.

    ``whiten="token"`` is verl's convention: per-token returns (discounted by ``gamma``) whitened over
    every response token, so long responses weigh more in the statistics; the advantage is then
    per token. The default whitens one reward per response (each response weighs the same).
    ``baseline="group_mean"`` is REINFORCE++-baseline: each reward minus its group's mean first, then
    whitened over the batch (OpenRLHF ``reinforce_baseline``; verl ``reinforce_plus_plus_baseline`` with
    ``whiten="token"``).
    """

    def __init__(
        self,
        eps: Annotated[
            float,
            Option(
                'added to the std (``whiten="response"``) or, as in verl, to the variance (``"token"``).', NON_NEGATIVE
            ),
        ] = 1e-8,
        whiten: str = "response",
        baseline: Annotated[
            str,
            Option("none (REINFORCE++) or group_mean (REINFORCE++-baseline: needs group_size >= 2).", OneOf(BASELINES)),
        ] = "none",
        gamma: Annotated[
            float,
            Option('discount of the returns over the response\'s tokens (needs ``whiten="token"``).', PROBABILITY),
        ] = 1.0,
    ) -> None:
        """
        Args:
            whiten: ``response`` (ours) or ``token`` (verl's ``compute_reinforce_plus_plus_outcome_advantage``).
        """
        if whiten not in WHITEN_SCOPES:
            raise ValueError(f"whiten={whiten!r} is not valid; choose one of {WHITEN_SCOPES}")
        check_options(BatchWhitenedAdvantage, locals())
        if gamma != 1.0 and whiten != "token":
            raise ValueError(f"gamma={gamma} discounts per-token returns: it needs whiten='token'")
        self.eps = eps
        self.whiten = whiten
        self.baseline = baseline
        self.gamma = gamma
        self.min_group_size = 2 if baseline == "group_mean" else 1

    def compute(self, rollout: Rollout) -> Tensor:
        rewards = rollout.reward
        if self.baseline == "group_mean":
            # r_i - mean(group), then whitened  (Hu et al. 2025 REINFORCE++-baseline; verl, OpenRLHF)
            rewards = estimators.centered_advantages(rewards, rollout.group_size)
        if self.whiten == "token":
            return estimators.token_whitened_returns(rewards, rollout.response_mask, self.gamma, eps=self.eps)
        return estimators.batch_whitened_advantages(rewards, rollout.group_size, eps=self.eps)


@documented_options
class OptimalTokenBaseline(AdvantageCallback):
    """OTB (Li et al. 2026, arXiv:2602.07078; verl ``optimal_token_baseline``): per-token advantages, each
    response's reward minus a baseline per step that weighs the group's rewards by how much gradient energy each
    response has accumulated up to that token (`core.advantage_estimators.optimal_token_baseline_advantages`).

    The energy of a token is ``1 - 2 p(y_t) + sum_v p(v)^2`` under the policy when the rollout is scored
    (`Policy.logit_statistics`: one forward without gradients per step). Steps count sampled tokens, so a
    multi-turn response's tool observations are skipped (verl's ``tir_optimal_token_baseline``; the two agree on
    single-turn responses).
    """

    min_group_size = 2
    reads_token_energy = True

    def __init__(
        self,
        zero_tail: Annotated[
            bool, Option("no baseline on a group's single longest response past its second longest (verl).")
        ] = True,
        eps: Annotated[float, Option("added to the baseline's denominator.", NON_NEGATIVE)] = 1e-8,
    ) -> None:
        check_options(OptimalTokenBaseline, locals())
        self.zero_tail, self.eps = zero_tail, eps

    def compute(self, rollout: Rollout) -> Tensor:
        if rollout.token_energy is None:
            raise ValueError("OptimalTokenBaseline needs rollout.token_energy (Policy.logit_statistics)")
        return estimators.optimal_token_baseline_advantages(
            rollout.reward, rollout.response_mask, rollout.token_energy, rollout.group_size, self.zero_tail, self.eps
        )
