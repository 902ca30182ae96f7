"""The critic of PPO: per-token values `V(s_t)` from a linear head on a trunk's last hidden states.

The trunk is the policy itself (`shared`: the head reads the hidden states of the policy's own forward,
as TRL's former `AutoModelForCausalLMWithValueHead` did) or a model of its own (`separate`: by default a
trainable copy of the policy, as verl initialises its critic from the actor's weights). Either way the
hidden states come from `Policy.token_log_probs_and_hidden` / `Policy.response_hidden_states`: the
position that predicts response token t, i.e. the state before token t is chosen.
"""

from __future__ import annotations

from torch import Tensor, nn

from rlvr_lightning.policies.base import Policy

VALUE_MODELS = ("separate", "shared")


class ValueHead(nn.Module):
    """`V = w . h + b` per position, in float32 whatever the trunk's dtype; zero-initialised, so every value
    starts at 0 (the critic then learns from returns, not from a random projection of the trunk)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """`[N, T]` values from hidden states `[N, T, H]`."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


def trainable_copy(policy: Policy) -> Policy:
    """A trainable copy of `policy`'s weights for a separate critic (the policy's own reference copy, unfrozen)."""
    copy = policy.create_reference()
    if not isinstance(copy, Policy):
        raise ValueError(
            f"value_model='separate' copies the policy as the critic's trunk, but {type(policy).__name__} made a "
            f"{type(copy).__name__} (a LoRA policy's reference holds no weights); pass a `critic` model, or use "
            "value_model='shared'"
        )
    copy.requires_grad_(True)
    copy.train()
    return copy


def check_hidden_states(trunk: Policy, role: str) -> int:
    """The trunk's hidden size, or a clear error when the policy class has no hidden-state hook."""
    try:
        return int(trunk.hidden_size)
    except NotImplementedError as error:
        raise ValueError(f"PPO's {role} needs hidden states: {error}") from None
