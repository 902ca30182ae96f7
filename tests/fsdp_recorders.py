"""Callbacks of the multi-process FSDP2 test runs (tests/fsdp_support.py builds their configs): what a rank
ends with (weights, where its parameters live, gradient all-reduces, sampling under sharding), and a pause
at a given step for the kill-and-resume test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from fsdp_support import PROMPTS, TINY_LLAMA

from rlvr_lightning.parallel import full_state_dict
from rlvr_lightning.policies.hf_options import HFModelOptions


class FinalWeights(pl.Callback):
    """At the end of fit, every rank takes part in assembling the full weights (`full_state_dict`); rank 0 saves
    them (and those it started with, the step count and the last metrics) to `<out>/<name>.pt`; every rank
    writes where its parameters live to `<name>.rank<r>.json` and the weights it assembled to `<name>.rank<r>.pt`
    (ranks that drifted apart assemble different ones)."""

    def __init__(self, out: str, name: str) -> None:
        self.out, self.name = out, name

    def on_train_start(self, trainer, pl_module):
        # cloned: under DDP these are views of the live weights
        self.initial = {k: v.clone() for k, v in full_state_dict(pl_module, device="cpu").items()}

    def on_train_end(self, trainer, pl_module):
        state = full_state_dict(pl_module, device="cpu")
        params = dict(pl_module.named_parameters())  # the policy's, and a reference's or a critic's
        placement = {
            "world_size": trainer.world_size,
            "dtensor_params": sum(type(p).__name__ == "DTensor" for p in params.values()),
            "plain_params": [name for name, p in params.items() if type(p).__name__ != "DTensor"],
            "local_numel": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params.values()),
            "full_numel": sum(state[name].numel() for name in params),
        }
        Path(self.out, f"{self.name}.rank{trainer.global_rank}.json").write_text(json.dumps(placement))
        torch.save(state, Path(self.out, f"{self.name}.rank{trainer.global_rank}.pt"))
        if trainer.is_global_zero:
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
            torch.save(
                {"state": state, "initial": self.initial, "global_step": trainer.global_step, "metrics": metrics},
                Path(self.out, f"{self.name}.pt"),
            )


class GradientSyncs(pl.Callback):
    """Under DDP, counts the gradient all-reduces (those of DDP's first bucket, through a communication hook) and
    writes the count to `<out>/<name>.syncs<r>.json` at the end of fit."""

    def __init__(self, out: str, name: str) -> None:
        self.out, self.name, self.count = out, name, 0

    def on_fit_start(self, trainer, pl_module):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counted(state, bucket):
            self.count += bucket.index() == 0
            return allreduce_hook(state, bucket)

        trainer.strategy.model.register_comm_hook(None, counted)

    def on_train_end(self, trainer, pl_module):
        Path(self.out, f"{self.name}.syncs{trainer.global_rank}.json").write_text(json.dumps(self.count))


class ShardedSampling(pl.Callback):
    """At the end of fit, every rank samples its own prompt for a rank-dependent number of tokens (4 + 5 x rank) with
    the trained policy inside `gathered_params`, and again with an unsharded copy of the same weights from the same
    seed; writes whether the two agree to `<out>/<name>.sampling<r>.json`."""

    def __init__(self, out: str, name: str, tokenizer_dir: str) -> None:
        self.out, self.name, self.tokenizer_dir = out, name, tokenizer_dir

    def on_train_end(self, trainer, pl_module):
        from rlvr_lightning.generation.sampling_config import SamplingConfig
        from rlvr_lightning.parallel import gathered_params
        from rlvr_lightning.policies.hf import HFPolicy

        rank = trainer.global_rank
        batch, sampling = {"prompt": [PROMPTS[rank]]}, SamplingConfig(max_new_tokens=4 + 5 * rank)
        plain = HFPolicy(model=HFModelOptions(config=TINY_LLAMA, tokenizer=self.tokenizer_dir))
        plain.load_state_dict(full_state_dict(pl_module.policy))
        torch.manual_seed(rank)
        with gathered_params(pl_module.policy):
            sharded = pl_module.policy.sample(batch, 2, sampling)
            again = pl_module.policy.sample(batch, 1, sampling)  # a second call inside the same gathering
        torch.manual_seed(rank)
        expected = plain.sample(batch, 2, sampling)
        result = {
            "width": sharded.response_ids.shape[1],
            "equal": torch.equal(sharded.response_ids, expected.response_ids),
            "second_call_rows": again.num_rows,
        }
        Path(self.out, f"{self.name}.sampling{rank}.json").write_text(json.dumps(result))


class WaitAtStep(pl.Callback):
    """At the start of rollout step `step` (0-based), rank 0 writes `marker` and waits to be killed."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, marker

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.fit_loop.epoch_loop._batches_that_stepped == self.step and trainer.is_global_zero:
            Path(self.marker).touch()
            time.sleep(600)
