"""`BEMA`: a bias-corrected exponential moving average of the policy's trainable weights (Block and Zhang 2025, "EMA
Without the Lag: Bias-Corrected Iterate Averaging Schemes", arXiv:2508.00180; the formula in `core/bema.py`), as
TRL's `BEMACallback`: validation answers with the averaged weights, the averaged policy can be saved at the end of
fit, and the KL reference can follow the averaged weights instead of a frozen start or periodic resets (TRL's BEMA
for the reference model).

    trainer:
      callbacks:
        - class_path: rlvr_lightning.callbacks.BEMA
          init_args: {update_freq: 1, save_to: runs/bema_policy}

`t` counts training steps (each rollout of an RL module, each batch of `SFTModule`): the snapshot `theta_0` is the
policy at the start of fit, or after `update_after` steps of burn-in, and the averages are updated after every
`update_freq`-th step from then on. They are kept in float32 on `device` (the CPU unless told otherwise: three copies
of the trainable weights) and saved in checkpoints, so that a resumed run continues them bitwise. With
`update_reference` the reference takes the averaged weights after each update (`kl.refresh_every` must be unset:
one of the two owns the reference). A sharded (FSDP2) policy is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from rlvr_lightning.core.bema import bema_coefficients, bema_update_
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, POSITIVE_INT, PROBABILITY


@documented_options
class BEMA(Callback):
    """Bias-corrected EMA of the policy's trainable weights: validation with them, the reference following them, the
    averaged policy saved (see the module docstring)."""

    def __init__(
        self,
        update_freq: Annotated[
            int, Option("update the averages every this many training steps (phi).", POSITIVE_INT)
        ] = 1,
        ema_power: Annotated[float, Option("kappa, the EMA rate's decay power (0: no averaging).", NON_NEGATIVE)] = 0.5,
        bias_power: Annotated[float, Option("eta, the bias correction's decay power.", NON_NEGATIVE)] = 0.2,
        lag: Annotated[float, Option("rho, the schedules' starting age.", NON_NEGATIVE)] = 10.0,
        update_after: Annotated[
            int, Option("tau, training steps of burn-in; the snapshot is taken after them.", NON_NEGATIVE_INT)
        ] = 0,
        multiplier: Annotated[float, Option("gamma, how much the schedules' age grows each step.", POSITIVE)] = 1.0,
        min_ema_multiplier: Annotated[float, Option("the EMA rate's floor.", PROBABILITY)] = 0.0,
        validate: Annotated[bool, Option("validate with the averaged weights (the live ones restored after).")] = True,
        update_reference: Annotated[
            bool, Option("the KL reference takes the averaged weights after each update.")
        ] = False,
        save_to: Annotated[
            str | None, Option("a directory the averaged policy is saved to at the end of fit (null: none).")
        ] = None,
        device: Annotated[str, Option("where the averages are kept.")] = "cpu",
    ) -> None:
        check_options(BEMA, locals())
        self.update_freq, self.update_after = update_freq, update_after
        self.schedule = dict(
            lag=lag,
            multiplier=multiplier,
            ema_power=ema_power,
            bias_power=bias_power,
            min_ema_multiplier=min_ema_multiplier,
        )
        self.validate, self.update_reference, self.save_to = validate, update_reference, save_to
        self.device = torch.device(device)
        self.step = 0  # training steps seen
        self.names: list[str] = []
        self.theta0: list[Tensor] = []
        self.ema: list[Tensor] = []
        self.bema: list[Tensor] = []
        self._restored: dict[str, Any] | None = None
        self._live: list[Tensor] | None = None  # the live weights while validation runs with the averaged ones

    # ------------------------------------------------------------------ set-up

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        policy = getattr(pl_module, "policy", None)
        if not isinstance(policy, nn.Module):
            raise TypeError(f"BEMA averages a module's policy; {type(pl_module).__name__} has none")
        if self.update_reference:
            if getattr(pl_module, "reference", None) is None:
                raise ValueError(
                    "BEMA.update_reference sets the KL reference, but the module keeps none: set kl.coef (or a loss "
                    "that reads the reference)"
                )
            refresh = getattr(getattr(pl_module, "kl", None), "refresh_every", None)
            if refresh:
                raise ValueError(
                    f"BEMA.update_reference and kl.refresh_every={refresh} both set the KL reference; unset one"
                )
        if self.save_to is not None and not callable(getattr(policy, "save_pretrained", None)):
            raise ValueError(f"BEMA.save_to saves with Policy.save_pretrained, which {type(policy).__name__} lacks")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        named = self._trainable(pl_module)
        if any(type(param).__name__ == "DTensor" for _, param in named):
            raise ValueError("BEMA keeps whole copies of the weights; a sharded (FSDP2) policy is not supported")
        self.names = [name for name, _ in named]
        state, self._restored = self._restored, None
        if state is not None:
            if state["names"] != self.names:
                raise ValueError("BEMA: the checkpoint's averages are of other parameters than this policy's")
            self.step = int(state["step"])
            self.theta0, self.ema, self.bema = (
                [t.to(self.device) for t in state[k]] for k in ("theta0", "ema", "bema")
            )
            return
        self.theta0 = [param.detach().to(self.device, torch.float32, copy=True) for _, param in named]
        self.ema = [t.clone() for t in self.theta0]
        self.bema = [t.clone() for t in self.theta0]

    @staticmethod
    def _trainable(pl_module: pl.LightningModule) -> list[tuple[str, nn.Parameter]]:
        return [(name, param) for name, param in pl_module.policy.named_parameters() if param.requires_grad]

    # ------------------------------------------------------------------ updates

    @torch.no_grad()
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx):
        self.step += 1
        if self.step < self.update_after:
            return
        live = [param for _, param in self._trainable(pl_module)]
        if self.step == self.update_after:  # the end of burn-in: everything restarts from here
            for buffers in (self.theta0, self.ema, self.bema):
                for buffer, param in zip(buffers, live, strict=True):
                    buffer.copy_(param.detach())
            return
        if (self.step - self.update_after) % self.update_freq:
            return
        alpha, beta = bema_coefficients(self.step, **self.schedule)
        bema_update_(live, self.theta0, self.ema, self.bema, alpha, beta)
        if self.update_reference:
            with self.averaged(pl_module):
                pl_module.policy.update_reference(pl_module.reference)
            torch.clear_autocast_cache()  # no cast of the old reference weights may outlive the refresh

    @contextmanager
    def averaged(self, pl_module: pl.LightningModule) -> Iterator[None]:
        """Inside, the policy's trainable weights are the averaged ones; the live ones come back after."""
        live = self._swap_in(pl_module)
        try:
            yield
        finally:
            self._restore(pl_module, live)

    @torch.no_grad()
    def _swap_in(self, pl_module: pl.LightningModule) -> list[Tensor]:
        """The averaged weights into the policy; returns the live ones (kept on `device`)."""
        params = [param for _, param in self._trainable(pl_module)]
        live = [param.detach().to(self.device, copy=True) for param in params]
        for param, average in zip(params, self.bema, strict=True):
            param.copy_(average)
        return live

    @torch.no_grad()
    def _restore(self, pl_module: pl.LightningModule, live: list[Tensor]) -> None:
        for (_, param), value in zip(self._trainable(pl_module), live, strict=True):
            param.copy_(value)
        torch.clear_autocast_cache()  # no cast of the averaged weights may outlive them

    # ------------------------------------------------------------------ validation, export

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.validate and self.bema and trainer.state.fn == "fit":
            self._live = self._swap_in(pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        live, self._live = self._live, None
        if live is not None:
            self._restore(pl_module, live)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.save_to is not None and trainer.is_global_zero:
            with self.averaged(pl_module):
                pl_module.policy.save_pretrained(self.save_to)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "names": list(self.names),
            "theta0": [t.cpu() for t in self.theta0],
            "ema": [t.cpu() for t in self.ema],
            "bema": [t.cpu() for t in self.bema],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict
