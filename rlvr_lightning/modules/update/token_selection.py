"""The pick of a token-selecting loss (`PolicyLoss.select_tokens`) over a whole mini-batch on every rank.

Each rank flattens the real tokens of its micro-batches (current and old log-probs, advantages, entropies: the
parameters do not change within a mini-batch, so a pass before the first backward sees what each micro-batch's
forward will), the ranks all-gather them in rank order, every rank runs the loss's pick on the same gathered
tokens with a generator seeded from rank 0, and each keeps its own slice, put back as ``[n, T]`` per micro-batch.
The result is the pick of one process holding the whole mini-batch. With one process the gather is a no-op.
`loss_keyword_inputs` hands a micro-batch's loss that pick with the other inputs a loss may read (entropies,
the reference's log-probs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from rlvr_lightning.core.losses.policy_loss_base import PolicyLoss, prepare_inputs
from rlvr_lightning.core.losses.token_selection import flat_tokens, unflatten
from rlvr_lightning.rollout import Rollout


class SelectionInputs:
    """One micro-batch's inputs to the pick: detached current log-probs ``[n, T]``, old log-probs (None: the
    current ones), advantages ``[n]`` or ``[n, T]``, the bool mask (None: every token) and entropies (or None)."""

    def __init__(self, log_probs, old_log_probs, advantages, mask, entropy=None) -> None:
        old, adv, self.mask = prepare_inputs(log_probs.detach(), old_log_probs, advantages, mask)
        self.shape = log_probs.shape
        columns = [log_probs.detach(), old, adv.expand(log_probs.shape)]
        if entropy is not None:
            columns.append(entropy.detach().to(log_probs.dtype))
        self.flat = torch.stack([flat_tokens(column, self.mask) for column in columns], dim=-1)  # [m, 3 or 4]


def all_gather_rows(rows: Tensor) -> tuple[Tensor, int]:
    """``rows`` (``[m, C]``) of every rank stacked in rank order, and where this rank's begin."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return rows, 0
    world, rank = dist.get_world_size(), dist.get_rank()
    count = torch.tensor([rows.shape[0]], device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    padded = rows.new_zeros((max(sizes), rows.shape[1]))
    padded[: rows.shape[0]] = rows
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    gathered = torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])
    return gathered, sum(sizes[:rank])


def shared_generator(device: torch.device) -> torch.Generator:
    """A generator seeded from the global RNG of rank 0, alike on every rank."""
    seed = torch.randint(0, 2**40, (1, 1)).to(torch.float64)  # float64 holds it exactly
    gathered, _ = all_gather_rows(seed.to(device))
    return torch.Generator(device=device).manual_seed(int(gathered[0, 0]))


def select_over_mini_batch(loss: PolicyLoss, parts: list[SelectionInputs]) -> list[Tensor]:
    """bool ``[n, T]`` per micro-batch: ``loss``'s pick over the tokens of every micro-batch of every rank."""
    local = torch.cat([part.flat for part in parts]) if len(parts) > 1 else parts[0].flat
    gathered, offset = all_gather_rows(local)
    entropy = gathered[:, 3] if gathered.shape[1] > 3 else None
    generator = shared_generator(gathered.device)
    picked = loss.select_tokens(gathered[:, 0], gathered[:, 1], gathered[:, 2], entropy, generator)
    mine = picked[offset : offset + local.shape[0]]
    selections, start = [], 0
    for part in parts:
        count = part.flat.shape[0]
        selections.append(unflatten(mine[start : start + count], part.mask, part.shape))
        start += count
    return selections


@torch.no_grad()
def mini_batch_selection(
    loss: PolicyLoss,
    forward: Callable[[Rollout], tuple[Tensor, Tensor | None]],
    micros: list[Rollout],
    masks: list[Tensor | None],
) -> list[Tensor | None]:
    """Per micro-batch, the tokens ``loss`` picks over the whole mini-batch (on every rank), from ``forward`` (log-probs
    and entropies, without autograd) before the first backward; ``masks``: the micro-batches' loss masks. Nones when
    the loss picks none, or when the mini-batch is one micro-batch: its own forward then serves
    (`PolicyUpdate.micro_batch_loss`)."""
    if not loss.selects_tokens or len(micros) == 1:
        return [None] * len(micros)
    parts = []
    for micro, mask in zip(micros, masks, strict=True):
        log_probs, entropy = forward(micro)
        entropy = entropy if loss.selection_reads_entropy else None
        parts.append(SelectionInputs(log_probs, micro.old_log_probs, micro.advantages, mask, entropy))
    return select_over_mini_batch(loss, parts)


def loss_keyword_inputs(
    loss: PolicyLoss,
    micro: Rollout,
    log_probs: Tensor,
    entropy: Tensor | None,
    mask: Tensor | None,
    selected,
    hidden: Tensor | None = None,
    top: tuple[Tensor, Tensor] | None = None,
    prompt_state: Tensor | None = None,
) -> dict[str, Tensor]:
    """What ``loss`` reads besides log-probs, old log-probs, advantages and mask, as keyword arguments: its pick of
    tokens (``selected``, over the mini-batch; None: picked here within this micro-batch), the tokens' detached
    entropies (``reads_entropy``), the reference's log-probs (``reads_reference``), each row's group and the group
    size (``reads_groups``), which rows are demonstrations (``reads_demonstrations``) and the policy forward's
    ``hidden`` states (``reads_hidden``), the summary of each row's prompt (``prompt_state``, ``reads_prompt_state``),
    the policy's ``top`` candidates (their ids and log-probs, ``reads_top_k``) and which responses are correct
    (``reads_correctness``)."""
    if loss.selects_tokens and selected is None:
        reads = entropy if loss.selection_reads_entropy else None
        (selected,) = select_over_mini_batch(
            loss, [SelectionInputs(log_probs, micro.old_log_probs, micro.advantages, mask, reads)]
        )
    inputs = {} if selected is None else {"selected": selected}
    if loss.reads_entropy:
        inputs["entropy"] = entropy.detach()
    if loss.reads_reference:
        inputs["ref_log_probs"] = micro.ref_log_probs
    if loss.reads_groups:
        inputs["group_index"], inputs["group_size"] = micro.group_index, micro.group_size
    if loss.reads_demonstrations:
        inputs["demonstration_rows"] = micro.demonstration_rows
    if loss.reads_hidden:
        inputs["hidden"] = hidden
    if loss.reads_prompt_state:
        inputs["prompt_state"] = prompt_state
    if loss.reads_top_k:
        ids, inputs["top_log_probs"] = top
        inputs["top_is_sampled"] = ids == micro.response_ids.to(ids.device).unsqueeze(-1)
    if loss.reads_correctness:
        inputs["correct"] = micro.correct
    return inputs
