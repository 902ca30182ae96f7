"""`RewardScoring`: what every module that samples and scores shares (RL, SFT, expert iteration).

Scoring a rollout with the run's reward callbacks, deciding which responses are correct or
well-formatted, and the validation loop: `val_group_size` sampled (or greedy) responses per
held-out prompt, mean reward and accuracy per batch, and pass@k, majority-vote accuracy,
format rate and response length as torchmetrics over the epoch.

A module using it sets `self.reward_callbacks`, `self.policy`, `self.sampling`,
`self.val_group_size` and `self.val_greedy`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from rlvr_lightning.evaluation import ValidationMetrics
from rlvr_lightning.policies.base import PromptBatch
from rlvr_lightning.rollout import Rollout


class RewardScoring:
    def transfer_batch_to_device(self, batch: PromptBatch, device: torch.device, dataloader_idx: int) -> PromptBatch:
        """Prompt batches are Python objects (token lists, text, metadata): the policy places what it tensorises."""
        return batch

    def score(self, rollout: Rollout) -> None:
        """Fill `rollout.rewards` (unweighted, by name) and `rollout.reward` (weighted sum)."""
        total = torch.zeros(rollout.num_rows, device=rollout.response_ids.device)
        for callback in self.reward_callbacks:
            scores = callback(rollout)
            rollout.rewards[callback.name] = scores
            total = total + callback.weight * scores
        rollout.reward = total

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        """`val_group_size` responses per held-out prompt: mean reward and accuracy per batch; pass@k,
        majority vote, format rate and response length accumulate in `validation_metrics` for the epoch."""
        sampling = dataclasses.replace(self.sampling, do_sample=not self.val_greedy)
        rollout = self.policy.sample(batch, self.val_group_size, sampling)
        self.score(rollout)
        metrics = {"val/reward_mean": rollout.reward.mean()}
        correct = self.correctness(rollout)
        if correct is not None:
            metrics["val/accuracy"] = correct.float().mean()
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=rollout.num_rows, prog_bar=True, sync_dist=True)
        format_ok, answers = self.correctness(rollout, kind="format"), self._final_answers(rollout)
        # Lightning validates in inference mode; metric states must stay ordinary tensors across passes.
        with torch.inference_mode(False):
            plain = lambda t: None if t is None else t.clone()  # noqa: E731
            masked = dataclasses.replace(rollout, response_mask=rollout.response_mask.clone())
            self.validation_metrics.update(masked, plain(correct), answers, plain(format_ok))

    @property
    def validation_metrics(self) -> ValidationMetrics:
        if getattr(self, "_validation_metrics", None) is None:
            with torch.inference_mode(False):
                self._validation_metrics = ValidationMetrics(group_size=self.val_group_size).to(self.device)
        return self._validation_metrics

    def on_validation_epoch_end(self) -> None:
        with torch.inference_mode(False):
            computed = self.validation_metrics.compute()  # torchmetrics syncs across ranks itself
            self.validation_metrics.reset()
        computed.pop("accuracy", None)  # logged per batch above
        if computed:
            self.log_dict({f"val/{name}": value for name, value in computed.items()}, on_epoch=True)

    def _final_answers(self, rollout: Rollout) -> list[str | None] | None:
        for callback in self.reward_callbacks:
            if callback.kind == "task":
                answers = callback.extract_answers(rollout)
                if answers is not None:
                    return answers
        return None

    def correctness(self, rollout: Rollout, kind: str = "task") -> Tensor | None:
        """`bool[N]` from the first reward of this `kind` that can tell whether a response satisfies it."""
        for callback in self.reward_callbacks:
            if callback.kind == kind:
                correct = callback.is_correct(rollout, rollout.rewards[callback.name])
                if correct is not None:
                    return correct
        return None
