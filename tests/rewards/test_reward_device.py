"""Rewards computed on the host join the rollout's device."""

import torch

from rlvr_lightning.modules import scoring
from rlvr_lightning.rewards.base import RewardCallback
from rlvr_lightning.rollout import Rollout

GPU = torch.device("cuda", 0)


class OnGPU(torch.Tensor):
    """A CPU tensor that says it is on a GPU: the rollout's tensors in a run on a GPU."""

    device = GPU


class HostReward(RewardCallback):
    def score(self, rollout):
        return torch.tensor([float(len(t)) for t in rollout.response_text])  # on the host, as most rewards


def test_host_scores_are_moved_to_the_rollouts_device(monkeypatch):
    """On a GPU the reward total lives on the rollout's device; adding a reward's host scores to it failed with
    'Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu'."""
    rollout = Rollout.from_texts(["1", "22"])
    rollout.response_ids = rollout.response_ids.as_subclass(OnGPU)
    moved_to = []
    to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        if args and args[0] == GPU:
            moved_to.append(args[0])
            return self
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    scores = HostReward()(rollout)
    assert moved_to == [GPU] and scores.tolist() == [1.0, 2.0]


def test_the_weighted_total_adds_host_scores():
    rollout = Rollout.from_texts(["1", "22"])
    scoring.score(rollout, [HostReward(weight=0.5)])
    assert rollout.reward.tolist() == [0.5, 1.0]
