"""`AdaptiveEntropyControl`: the entropy bonus's weight set each step from the policy's entropy (Skywork-OR1).

A fixed entropy bonus either does too little or makes the entropy grow without bound. Skywork-OR1 (He et al.
2025, "Skywork Open Reasoner 1 Technical Report", arXiv:2505.22312, §3.3) keeps a coefficient ``c`` and, after
each step k, compares that step's entropy ``e_k`` with a target:

    c_{k+1} = clip(c_k + delta if e_k < target else c_k - delta, min_coef, max_coef)
    the weight step k+1 trains with: c_{k+1} if e_k < target, else 0

so the bonus is on only while the entropy is under the target, and grows the longer it stays there
(`core.entropy.adaptive_entropy_coefficient`). ``e_k`` is the step's ``train/entropy``: the policy's mean
per-token entropy over the vocabulary on the responses it trains on, in the update's first epoch. The authors'
code estimates the same quantity as the mean negative log-probability of the sampled tokens.

    trainer:
      callbacks:
        - class_path: rlvr_lightning.callbacks.AdaptiveEntropyControl
          init_args: {target: 0.2, delta: 0.0001, max_coef: 0.005}

The module's own ``entropy_coef`` must stay 0: this callback owns the weight. Its state (the coefficient and
whether the bonus is on) is saved in checkpoints, so a resumed run continues where it stopped. The weight each
step trained with is logged as ``train/entropy_coef``.
"""

from __future__ import annotations

from typing import Annotated, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from rlvr_lightning.core.entropy import adaptive_entropy_coefficient
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, POSITIVE


@documented_options
class AdaptiveEntropyControl(Callback):
    """Skywork-OR1's adaptive entropy bonus: on while the policy's entropy is under ``target``, its weight rising
    by ``delta`` each step it stays there and falling by ``delta`` each step above (see the module docstring)."""

    def __init__(
        self,
        target: Annotated[
            float, Option("the entropy (nats per token) under which the bonus is on (the authors' 0.2).", POSITIVE)
        ] = 0.2,
        delta: Annotated[
            float, Option("how much the coefficient rises or falls each step (the authors' 1e-4).", POSITIVE)
        ] = 1e-4,
        max_coef: Annotated[float, Option("the coefficient's ceiling (the authors' 0.005).", NON_NEGATIVE)] = 0.005,
        min_coef: Annotated[float, Option("the coefficient's floor.", NON_NEGATIVE)] = 0.0,
        initial_coef: Annotated[float, Option("the coefficient of the first step.", NON_NEGATIVE)] = 0.0,
    ) -> None:
        check_options(AdaptiveEntropyControl, locals())
        if not min_coef <= initial_coef <= max_coef:
            raise ValueError(
                f"AdaptiveEntropyControl needs min_coef <= initial_coef <= max_coef, got min_coef={min_coef}, "
                f"initial_coef={initial_coef}, max_coef={max_coef}"
            )
        self.target, self.delta, self.min_coef, self.max_coef = target, delta, min_coef, max_coef
        self.coef = initial_coef
        self.enabled = True  # the authors' controller starts with the bonus on (at the initial coefficient)
        self._measured: Any = None  # the `train/entropy` tensor already used: a step without an update logs none

    @property
    def weight(self) -> float:
        """The entropy bonus's weight for the next step."""
        return self.coef if self.enabled else 0.0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        update = getattr(pl_module, "policy_update", None)
        if update is None or not hasattr(update, "entropy_coef"):
            raise TypeError(
                f"AdaptiveEntropyControl sets the entropy bonus of an RL module's update (RLVRModule, PPOModule); "
                f"{type(pl_module).__name__} has none"
            )
        if update.entropy_coef != 0:
            raise ValueError(
                f"model.entropy_coef={update.entropy_coef:g} and AdaptiveEntropyControl both set the entropy bonus; "
                "leave entropy_coef at 0 and give the first step's weight as AdaptiveEntropyControl.initial_coef"
            )
        update.logs_entropy_coef = True

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        pl_module.policy_update.entropy_coef = self.weight

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx):
        entropy = trainer.callback_metrics.get("train/entropy")
        if entropy is None or entropy is self._measured:  # no update this step (asynchronous rollouts' first)
            return
        self._measured = entropy
        self.coef, self.enabled = adaptive_entropy_coefficient(
            self.coef, float(entropy), self.target, self.delta, self.min_coef, self.max_coef
        )

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef, "enabled": self.enabled}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.coef, self.enabled = float(state_dict["coef"]), bool(state_dict["enabled"])
