"""Demonstrations from the data in each group: LUFFY's mixed-policy groups (Yan et al. 2025, arXiv:2504.14945).

With `demonstrations.per_group: k`, `RLVRModule` samples `group_size - k` responses per prompt and adds the prompt's
demonstration (its `metadata[key]`, or `template` filled from its metadata) as the last `k` rows of the group
(the authors' setting: 7 sampled and 1 demonstration). The rewards score a demonstration like any response, the
advantage estimator sees the whole group, and `rollout.demonstration_rows` tells the loss which rows were not
sampled (`core.LUFFY` trains them with its policy shaping). A demonstration row has no sampling log-probs, so the
rollout keeps none (where the update needs old log-probs the trainer computes them for every row); its prompt
tokens are its group's.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from rlvr_lightning.modules.pair_rollouts import response_token_ids
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.rollout import Rollout, TokenSource
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT


@documented_options
@dataclass(frozen=True)
class DemonstrationConfig:
    """LUFFY's off-policy guidance: `per_group` rows of each group are the prompt's demonstration, not sampled."""

    per_group: Annotated[
        int,
        Option(
            "rows of each group that are the prompt's demonstration from the data instead of a sampled response "
            "(LUFFY: 1 of 8); 0: none.",
            NON_NEGATIVE_INT,
        ),
    ] = 0
    key: Annotated[
        str,
        Option(
            "the metadata field holding a prompt's demonstration: text, or token ids for a toy policy; a list of "
            "several (texts, or token-id lists) fills the per_group rows in turn."
        ),
    ] = "solution"
    template: Annotated[
        str | None,
        Option(
            "a demonstration written from the prompt's metadata fields instead, e.g. "
            "'The answer is \\boxed{{{answer}}}.' (null: the field `key` as it is)."
        ),
    ] = None

    def __post_init__(self) -> None:
        check_options(DemonstrationConfig, vars(self), "demonstrations.")

    def sampled_group_size(self, group_size: int) -> int:
        """The responses sampled per prompt: `group_size` less the demonstrations."""
        if self.per_group >= group_size:
            raise ValueError(
                f"demonstrations.per_group={self.per_group} must be below group_size={group_size}: each group samples "
                "group_size - per_group responses of its own"
            )
        return group_size - self.per_group

    def demonstrations(self, metadata: dict[str, Any], group: int) -> list[Any]:
        """The `per_group` demonstrations of the prompt whose metadata is `metadata` (`group`: its place in the
        batch): its one demonstration repeated, or its several taken in turn."""
        fields = ", ".join(sorted(metadata)) or "none"
        if self.template is not None:
            try:
                shown = [self.template.format(**metadata)]
            except (KeyError, IndexError) as error:
                raise ValueError(
                    f"demonstrations.template={self.template!r} names {error}, which prompt {group} of the batch "
                    f"lacks (its metadata fields: {fields})"
                ) from None
        else:
            value = metadata.get(self.key)
            several = isinstance(value, (list, tuple)) and any(isinstance(v, (str, list, tuple)) for v in value)
            shown = list(value) if several else [value]
            if not shown or any(v is None or (isinstance(v, (str, list, tuple)) and len(v) == 0) for v in shown):
                raise ValueError(
                    f"demonstrations.key={self.key!r}: prompt {group} of the batch has no demonstration there (its "
                    f"metadata fields: {fields}); set demonstrations.key or demonstrations.template"
                )
        return [shown[j % len(shown)] for j in range(self.per_group)]


def check_demonstrations(
    config: DemonstrationConfig, loss, group_filter, replay, rollout_is, rollout_staleness: int, teacher
) -> None:
    """Refuse, before anything is built, what demonstrations cannot be combined with: a loss that would train them as
    sampled responses, and `RLVRModule`'s options that read sampling log-probs or choose rows."""
    if not config.per_group:
        return
    others = {
        "group_filter.keep": group_filter.keep is not None,
        "replay.size": replay.size > 0,
        "rollout_is.mode": rollout_is.mode is not None,
        "rollout_staleness": rollout_staleness > 0,
        "teacher": teacher is not None,
    }
    if not loss.reads_demonstrations:
        raise ValueError(
            f"demonstrations.per_group={config.per_group} adds demonstrations that the loss "
            f"{type(loss).__name__} would train as sampled responses; use loss: luffy (rlvr_lightning.core.LUFFY) or a "
            "loss that reads_demonstrations"
        )
    for name, on in others.items():
        if on:
            raise ValueError(
                f"demonstrations.per_group={config.per_group} cannot be combined with {name}: a demonstration has no "
                "sampling log-probs and must stay in its group; turn one of them off"
            )


def check_first_demonstration(config: DemonstrationConfig, datamodule: Any, policy: Policy) -> None:
    """At set-up, the first training prompt's demonstration made and tokenised as a step will: a wrong `key` or
    `template` stops the run before any sampling, naming the option."""
    source = getattr(datamodule, "source", None)
    if not config.per_group or not callable(source):
        return
    example = source()[0]
    metadata = {name: value for name, value in example.items() if name != "prompt"}
    shown = config.demonstrations(metadata, 0)
    _check_lengths(policy, [response_token_ids(policy, one) for one in shown], per_group=config.per_group)


def add_demonstrations(
    policy: Policy, sampled: Rollout, config: DemonstrationConfig, max_tokens: int | None = None
) -> Rollout:
    """`sampled` (groups of `group_size - per_group`) with each prompt's demonstration as the last `per_group` rows
    of its group; `demonstration_rows` marks them (`sampled` itself without demonstrations). A text demonstration
    longer than `max_tokens` (the sampling budget) is cut to it and marked truncated, as a sampled response that
    reaches the budget is, and its text is what is left (the rewards judge what is trained)."""
    s, k = sampled.group_size, config.per_group
    if not k:
        return sampled
    firsts = list(range(0, sampled.num_rows, s))
    groups = len(firsts)
    responses = [shown for g, row in enumerate(firsts) for shown in config.demonstrations(sampled.metadata[row], g)]
    ids = [response_token_ids(policy, response) for response in responses]
    _check_lengths(policy, ids, per_group=k)
    cut = [hasattr(policy, "tokenizer") and max_tokens is not None and len(row) > max_tokens for row in ids]
    if any(cut):
        warnings.warn(
            f"demonstrations longer than sampling.max_new_tokens={max_tokens} are cut to it and marked truncated "
            "(train/demonstrations/truncated_frac); shorten them or raise the budget",
            stacklevel=2,
        )
        ids = [row[:max_tokens] if c else row for row, c in zip(ids, cut, strict=True)]
        responses = [list(row) if c else r for row, r, c in zip(ids, responses, cut, strict=True)]
    device = sampled.response_ids.device
    width = max(len(row) for row in ids)
    response_ids = torch.zeros(len(ids), width, dtype=torch.long, device=device)
    response_mask = torch.zeros(len(ids), width, device=device)
    for i, row in enumerate(ids):
        response_ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        response_mask[i, : len(row)] = 1.0
    first = torch.as_tensor(firsts, device=device).repeat_interleave(k)  # each demonstration row's group's first row
    rows = first.tolist()
    demos = Rollout(
        prompt_ids=sampled.prompt_ids[first],
        prompt_mask=sampled.prompt_mask[first],
        response_ids=response_ids,
        response_mask=response_mask,
        group_index=sampled.group_index[first],
        group_size=s,
        truncated=torch.tensor(cut, dtype=torch.bool, device=device),
        prompt_text=None if sampled.prompt_text is None else [sampled.prompt_text[row] for row in rows],
        response_text=None if sampled.response_text is None else [_text(policy, r) for r in responses],
        metadata=[dict(sampled.metadata[row]) for row in rows],
        prompts=None if sampled.prompts is None else [sampled.prompts[row] for row in rows],
        response_source=None if sampled.response_source is None else _sampled_source(response_mask),
    )
    sampled = dataclasses.replace(sampled, sampling_log_probs=None, old_log_probs=None)  # none for a demonstration
    joined = Rollout.concat([sampled, demos])
    order = torch.cat(
        [torch.arange(s).view(1, s) + s * torch.arange(groups).view(groups, 1),
         sampled.num_rows + torch.arange(k).view(1, k) + k * torch.arange(groups).view(groups, 1)],
        dim=1,
    ).reshape(-1)  # fmt: skip
    mixed = joined.select(order.to(device), order.tolist())
    return dataclasses.replace(
        mixed,
        group_index=sampled.group_index[first[::k]].repeat_interleave(s + k),
        group_size=s + k,
        demonstration_rows=torch.tensor([False] * s + [True] * k, device=device).repeat(groups),
    )


def demonstration_metrics(rollout: Rollout) -> dict[str, torch.Tensor]:
    """The scored rollout's mean reward over its sampled rows and over its demonstrations ({} without any)."""
    shown = rollout.demonstration_rows
    if shown is None:
        return {}
    return {
        "train/demonstrations/reward_mean": rollout.reward[shown].mean(),
        "train/demonstrations/sampled_reward_mean": rollout.reward[~shown].mean(),
        "train/demonstrations/truncated_frac": rollout.truncated[shown].float().mean(),
    }


def _check_lengths(policy: Policy, ids: list[list[int]], per_group: int = 1) -> None:
    """`ids`: each prompt's `per_group` demonstrations in turn."""
    expected = getattr(policy, "response_length", None)  # a toy policy's fixed response length
    for i, row in enumerate(ids):
        group = i // per_group
        if not row:
            raise ValueError(f"the demonstration of prompt {group} of the batch is empty")
        if expected is not None and not hasattr(policy, "tokenizer") and len(row) > expected:
            raise ValueError(
                f"{type(policy).__name__} has response_length={expected}, but the demonstration of prompt {group} of "
                f"the batch has {len(row)} tokens: {row}"
            )


def _text(policy: Policy, response: Any) -> str:
    if isinstance(response, str):
        return response
    return policy.tokenizer.decode(list(response), skip_special_tokens=True)


def _sampled_source(response_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(response_mask > 0, int(TokenSource.SAMPLED), int(TokenSource.PAD)).long()
