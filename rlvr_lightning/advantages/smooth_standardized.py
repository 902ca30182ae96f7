"""`SmoothStandardizedAdvantage`: DCPO's advantage, each prompt's rewards standardized by this step's group and by
every group the prompt has had, smoothed (`core.smooth_standardization`).

A prompt is known by a digest of its token ids (`prompt_state.py`). The statistics live in the callback and in
checkpoints (`state_dict`), so a resumed run standardizes as the uninterrupted one. Under data parallelism every
rank gathers the step's groups from all ranks and folds them in the same order, so every rank holds the same
statistics and a rank's advantages are those one process would compute for the global batch. A prompt that
appears twice in one step is folded in twice, in order: as if its second group came one step later.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from torch import Tensor

from rlvr_lightning.advantages.callbacks import AdvantageCallback
from rlvr_lightning.advantages.prompt_state import gathered, in_waves, prompt_digests, rank
from rlvr_lightning.core.smooth_standardization import PromptRewardStats, smooth_standardized_advantages
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options


@documented_options
class SmoothStandardizedAdvantage(AdvantageCallback):
    """DCPO's smooth advantage standardization (Yang et al. 2025, arXiv:2509.02333): a response's reward
    standardized by its group and by all the rewards its prompt has received in the run, the two mixed with weights
    1/i and (i-1)/i (i: the steps that have sampled the prompt), the mix smaller in magnitude kept. A group whose
    rewards all agree still teaches once its prompt has been answered differently before."""

    min_group_size = 2

    def __init__(
        self,
        scale_by_std: Annotated[
            bool, Option("divide by the standard deviations (the authors' norm_adv_by_std_in_grpo).")
        ] = True,
    ) -> None:
        check_options(SmoothStandardizedAdvantage, locals())
        self.scale_by_std = scale_by_std
        self.stats: dict[str, tuple[float, float, int]] = {}  # prompt digest -> (mean, std, visits)
        self._metrics: dict[str, float] = {}

    def compute(self, rollout: Rollout) -> Tensor:
        parts = gathered((prompt_digests(rollout), rollout.reward.detach().double().cpu()))
        digests, rewards = [key for keys, _ in parts for key in keys], torch.cat([part for _, part in parts])
        advantages, size, revisited = torch.empty_like(rewards), rollout.group_size, 0
        for wave in in_waves(digests):  # a prompt's second group in this step sees the statistics after its first
            revisited += sum(digests[group] in self.stats for group in wave)
            self._fold([digests[group] for group in wave], wave, rewards, advantages, size)
        self._metrics = {"train/sas/revisited_frac": revisited / len(digests)}
        start = sum(len(keys) for keys, _ in parts[: rank()]) * size
        own = advantages[start : start + rollout.num_rows]
        return own.to(device=rollout.reward.device, dtype=rollout.reward.dtype)

    def _fold(self, keys: list[str], groups: list[int], rewards: Tensor, advantages: Tensor, size: int) -> None:
        """The advantages of `groups` (distinct prompts) into `advantages`, and their prompts' statistics updated."""
        known = [self.stats.get(key, (0.0, 0.0, 0)) for key in keys]
        prior = PromptRewardStats(*(torch.tensor(column, dtype=torch.float64) for column in zip(*known, strict=True)))
        rows = torch.tensor([group * size + k for group in groups for k in range(size)])
        advantages[rows], after = smooth_standardized_advantages(rewards[rows], size, prior, self.scale_by_std)
        columns = (after.mean.tolist(), after.std.tolist(), after.visits.long().tolist())
        self.stats.update(zip(keys, zip(*columns, strict=True), strict=True))

    def step_metrics(self) -> dict[str, float]:
        return self._metrics

    def state_dict(self) -> dict[str, Any]:
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stats = {key: tuple(value) for key, value in state_dict["stats"].items()}
