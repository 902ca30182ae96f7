"""A reward in a file of its own: 1 when the response starts with the smallest token of its prompt."""

from rlvr_lightning.rewards import RewardCallback


class StartsWithSmallestReward(RewardCallback):
    """1 when the response starts with the smallest token of its prompt (a sort-task partial credit)."""

    def score(self, rollout):
        # one number per response, for the whole batch at once (or override score_row(rollout, i))
        smallest = rollout.prompt_ids.min(dim=-1).values
        return (rollout.response_ids[:, 0] == smallest).float()
