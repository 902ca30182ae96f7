"""`OptimalValueAdvantage`: A*-PO's advantage, the reward minus the optimal value estimated from the reference.

A*-PO (Brantley et al. 2025, "Accelerating RL for LLM Reasoning with Optimal Advantage Regression",
arXiv:2505.20686) estimates, once per prompt, the value of the KL-regularised optimal policy from ``num_samples``
responses of the frozen reference policy:

    V*(x) = beta1 log( (1/n) sum_i exp(r(x, y_i) / beta1) )

(a soft maximum of the reference's rewards: their mean as beta1 grows, their maximum as it shrinks), then trains
on one response per prompt with the advantage ``r(x, y) - V*(x)`` (its loss: `core.losses.AStarPO`).

Here the reference's responses to a prompt are sampled and scored with the run's rewards the first time a
training batch brings that prompt, before the step samples the policy's; ``V*`` is then kept (and saved in
checkpoints), so a dataset read for several epochs samples the reference once per prompt, as the paper's offline
first stage does. The reference is the run's frozen copy of the initial policy: the module builds one for a loss
that reads it (``astar_po``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import torch
from torch import Tensor

from rlvr_lightning.advantages.callbacks import AdvantageCallback
from rlvr_lightning.advantages.prompt_state import prompt_key
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import POSITIVE, POSITIVE_INT


def optimal_values(rewards: Tensor, beta1: float) -> Tensor:
    """``V*`` per prompt ``[P]`` from the reference's rewards ``[P, n]``."""
    # V*(x) = beta1 log mean_i exp(r_i / beta1)  (Brantley et al. 2025 A*-PO, arXiv:2505.20686, stage 1;
    # TRL A2POTrainer._estimate_optimal_values), through logsumexp
    return beta1 * (torch.logsumexp(rewards.double() / beta1, dim=-1) - math.log(rewards.shape[-1]))


@documented_options
class OptimalValueAdvantage(AdvantageCallback):
    """A = r - V*(x), V* a soft maximum of the reference policy's rewards on the prompt (A*-PO; see the module
    docstring)."""

    reads_step_batch = "estimates V* for each prompt of the step's batch"

    def __init__(
        self,
        beta1: Annotated[float, Option("the soft maximum's temperature (the paper's 0.5).", POSITIVE)] = 0.5,
        num_samples: Annotated[
            int, Option("the reference's responses per prompt that estimate V* (the paper's 8).", POSITIVE_INT)
        ] = 8,
    ) -> None:
        check_options(OptimalValueAdvantage, locals())
        self.beta1, self.num_samples = beta1, num_samples
        self.values: dict[Any, float] = {}  # V* by prompt
        self._step_values: Tensor | None = None  # V* of the step's prompts, in the batch's order

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and not callable(getattr(getattr(pl_module, "reference", None), "sample", None)):
            raise ValueError(
                "OptimalValueAdvantage samples the reference policy to estimate V*, and this run has none that "
                "samples: use the astar_po loss (which builds a reference), and a policy without LoRA (a LoRA "
                "policy's reference is its adapter switched off, which does not sample)"
            )

    def on_train_batch_start(self, trainer, pl_module, batch: dict[str, list], batch_idx: int) -> None:
        """Sample and score the reference's responses to the batch's prompts whose V* is not known yet."""
        keys = [prompt_key(prompt) for prompt in batch["prompt"]]
        new = list(dict.fromkeys(key for key in keys if key not in self.values))
        if new:
            first = {key: keys.index(key) for key in new}
            unseen = {name: [values[first[key]] for key in new] for name, values in batch.items()}
            sampled = pl_module.reference.sample(unseen, self.num_samples, pl_module.sampling)
            pl_module.score(sampled)
            rewards = sampled.reward.view(len(new), self.num_samples)
            self.values.update(zip(new, optimal_values(rewards, self.beta1).tolist(), strict=True))
        self._step_values = torch.tensor([self.values[key] for key in keys])

    def compute(self, rollout: Rollout) -> Tensor:
        if self._step_values is None:
            raise ValueError("OptimalValueAdvantage has no V* for this step's prompts (on_train_batch_start ran?)")
        v_star = self._step_values.to(rollout.reward)[rollout.group_index.to(rollout.reward.device)]
        return rollout.reward - v_star

    def state_dict(self) -> dict[str, Any]:
        return {"values": dict(self.values)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.values = dict(state_dict["values"])
