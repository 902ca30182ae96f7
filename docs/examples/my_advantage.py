"""An advantage estimator in a file of its own: centred ranks within each group."""

from rlvr_lightning.advantages import AdvantageCallback


class GroupRankAdvantage(AdvantageCallback):
    """A = the response's rank within its group, centred and scaled to [-1, 1] (ties share their mean rank).

    Only the order of the rewards counts, not their scale: a reward with rare large values
    moves the policy no more than one with small steps.
    """

    min_group_size = 2  # checked when the run starts

    def compute(self, rollout):
        rewards = rollout.reward.view(-1, rollout.group_size)  # [prompts, group]; a group's rows are adjacent
        below = (rewards.unsqueeze(-1) > rewards.unsqueeze(-2)).sum(-1)  # rewards below each response's
        equal = (rewards.unsqueeze(-1) == rewards.unsqueeze(-2)).sum(-1)  # itself included
        rank = below + (equal - 1) / 2  # 0 .. group_size - 1, mean rank for ties
        advantages = 2 * rank / (rollout.group_size - 1) - 1
        return advantages.reshape(-1).float()  # float[N]: one advantage per response
