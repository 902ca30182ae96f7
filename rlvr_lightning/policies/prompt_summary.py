"""A summary of each prompt from a causal language model: the mean of its decoder's last hidden states (after the
final norm, what the output layer reads) over the prompt's tokens but its last, as FlowRL's authors feed their
partition-function head (verl recipe/flowrl `FlowRLActor._forward_micro_batch`: `masked_mean` of
`hidden_states[-1][:, : -response_length - 1]` under the attention mask). A causal model's states at the prompt's
positions do not depend on the response, so a forward over the prompts alone gives the states of the joint one."""

from __future__ import annotations

from torch import Tensor, nn

from rlvr_lightning.generation.loop import position_ids_from_mask


def mean_prompt_state(decoder: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor:
    """`[N, H]` for left-padded prompts `[N, P]`: the mean over each row's real tokens but its last of the decoder's
    last hidden states (differentiable); 0 for a prompt of one token."""
    used = prompt_mask.bool().any(0).nonzero()
    if used.numel() == 0:
        raise ValueError("prompt_state: every prompt in the rows is empty")
    first = int(used[0].item())  # the columns every row pads are left out
    ids, mask = prompt_ids[:, first:], prompt_mask[:, first:]
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
    states, keep = out.last_hidden_state[:, :-1], mask[:, :-1].unsqueeze(-1).to(out.last_hidden_state.dtype)
    return (states * keep).sum(1) / keep.sum(1).clamp(min=1)


__all__ = ["mean_prompt_state"]
