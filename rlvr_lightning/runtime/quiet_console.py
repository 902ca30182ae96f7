"""`quiet_third_party`: the other libraries' messages that `rlvr` does not print, each with its reason.

Every message here was seen on a run of a shipped config, is harmless, and cannot be fixed from this
package's side; what this package caused is fixed where it is caused instead. docs/troubleshooting.md
lists the messages that are left. `rlvr` applies `quiet_third_party` once, before the configured classes are
built, and `quiet_loggers` to the trainer's loggers.
"""

from __future__ import annotations

import logging
import warnings

# (message regex, category, module regex) for `warnings.filterwarnings("ignore", ...)`, each with its reason.
IGNORED_WARNINGS: list[tuple[str, type[Warning], str]] = [
    # Lightning 2.6 flattens every batch with torch's LeafSpec, which torch 2.13 deprecates; nothing to change here
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
    # PEFT (LoRA policies) reads transformers' old name for a model's activation checkpointing
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
    # the modules override transfer_batch_to_device on purpose (prompt batches are Python objects, not tensors)
    (r"You have overridden `transfer_batch_to_device` in `LightningModule`", UserWarning, r"lightning\.pytorch\."),
    # a finite task's prompt stream (`PromptStream`) is an IterableDataset with a length, which stays exact with
    # worker processes: each yields its own batches (j = worker mod num_workers) and no two yield the same
    (r"Your `IterableDataset` has `__len__` defined", UserWarning, r"lightning\.pytorch\."),
]
# Lightning's advertisements for its cloud packages (litlogger, litmodels), printed at every start
IGNORED_LOG_PREFIXES = {f"lightning.{part}.utilities.rank_zero": ("💡 Tip: ",) for part in ("fabric", "pytorch")}


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_loggers(loggers: object) -> None:
    """Lightning's `WandbLogger` passes `anonymous=None` to `wandb.init` when the option is not set, which W&B
    answers on every run with `The anonymous setting has no effect and will be removed`: leave the setting out
    when it is not set (`loggers`: the trainer's `logger` argument, one logger or a list)."""
    for logger in loggers if isinstance(loggers, (list, tuple)) else [loggers]:
        init = getattr(logger, "_wandb_init", None)
        if isinstance(init, dict) and "anonymous" in init and init["anonymous"] is None:
            del init["anonymous"]


def quiet_third_party() -> None:
    """Install the filters above (once)."""
    for message, category, module in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefixes in IGNORED_LOG_PREFIXES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefixes) for f in logger.filters):
            logger.addFilter(_DropPrefixes(prefixes))
