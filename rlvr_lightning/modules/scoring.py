"""`RewardScoring`: what every module that samples and scores shares (RL, SFT, expert iteration).

Scoring a rollout with the run's reward callbacks, deciding which responses are correct or
well-formatted, and the validation loop: `validation.group_size` sampled (or greedy) responses per
held-out prompt, mean reward and accuracy per batch, and pass@k, majority-vote accuracy,
format rate and response length as torchmetrics over the epoch.

A module using it sets `self.reward_callbacks`, `self.policy`, `self.sampling`,
and `self.validation` (a `ValidationConfig`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from rlvr_lightning.evaluation import ValidationMetrics
from rlvr_lightning.parallel.fsdp import gathered_params
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

    def per_reward_metrics(self, rollout: Rollout, prefix: str) -> dict[str, Tensor | float]:
        """Each reward's mean (`{prefix}/rewards/<name>`) and the rows it failed on since the last call
        (`{prefix}/reward_errors/<name>`)."""
        metrics: dict[str, Tensor | float] = {}
        for callback in self.reward_callbacks:
            metrics[f"{prefix}/rewards/{callback.name}"] = rollout.rewards[callback.name].mean()
            metrics[f"{prefix}/reward_errors/{callback.name}"] = float(callback.pop_errors())
        return metrics

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        """`validation.group_size` responses per held-out prompt: mean reward and accuracy per batch; pass@k,
        majority vote, format rate and response length accumulate in `validation_metrics` for the epoch."""
        sampling = dataclasses.replace(self.sampling, do_sample=not self.validation.greedy)
        with gathered_params(self.policy):
            rollout = self.policy.sample(batch, self.validation.group_size, sampling)
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

    def predict_step(self, batch: PromptBatch, batch_idx: int) -> list[dict]:
        """`validation.group_size` completions per prompt, decoded as in validation and scored: one row each
        (`rlvr predict` writes them to JSONL)."""
        sampling = dataclasses.replace(self.sampling, do_sample=not self.validation.greedy)
        with gathered_params(self.policy):
            rollout = self.policy.sample({"prompt": batch["prompt"], "metadata": batch.get("metadata")}, self.validation.group_size, sampling)
        self.score(rollout)
        return completion_rows(rollout, self.correctness(rollout))

    @property
    def validation_metrics(self) -> ValidationMetrics:
        if getattr(self, "_validation_metrics", None) is None:
            with torch.inference_mode(False):
                self._validation_metrics = ValidationMetrics(group_size=self.validation.group_size).to(self.device)
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


def completion_rows(rollout: Rollout, correct: Tensor | None = None) -> list[dict]:
    """One plain dict per row: prompt and completion (text, or token ids without padding), rewards, correctness."""
    prompt_ids, response_ids = rollout.prompt_ids.cpu(), rollout.response_ids.cpu()
    prompt_mask, response_mask = rollout.prompt_mask.bool().cpu(), rollout.response_mask.bool().cpu()
    rewards = {name: values.tolist() for name, values in rollout.rewards.items()}
    totals = rollout.reward.tolist() if rollout.reward is not None else [None] * rollout.num_rows
    rows = []
    for i in range(rollout.num_rows):
        rows.append({
            "prompt": rollout.prompt_text[i] if rollout.prompt_text else prompt_ids[i][prompt_mask[i]].tolist(),
            "completion": rollout.response_text[i] if rollout.response_text else response_ids[i][response_mask[i]].tolist(),
            "reward": totals[i],
            "rewards": {name: values[i] for name, values in rewards.items()},
            "correct": None if correct is None else bool(correct[i]),
            "truncated": bool(rollout.truncated[i]),
            "metadata": rollout.metadata[i] if rollout.metadata else {},
        })
    return rows
