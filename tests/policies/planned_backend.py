"""A fake generation backend for the segmented-generation tests: a plan says what each context continues
with, and the backend applies EOS, stop strings and caps to it token by token, as a real backend does."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr_lightning.generation.backend import GenerationBackend, response_tensors
from rlvr_lightning.generation.output import GenerationOutput


def sampled_log_prob(position: int) -> float:
    """The recorded log-prob of the token at `position` of a segment (recognisable, never 0)."""
    return -0.5 - 0.01 * position


class PlannedBackend(GenerationBackend):
    def __init__(self, tokenizer, plan: Callable[[str], str]) -> None:
        """`plan(context text) -> continuation text` (`<eos>` in it stands for the EOS token)."""
        self.tokenizer = tokenizer
        self.plan = plan
        self.calls: list[dict] = []  # what each generate call received

    def continuation(self, context: list[int]) -> list[int]:
        text = self.plan(self.tokenizer.decode(context))
        ids: list[int] = []
        for k, piece in enumerate(text.split("<eos>")):
            if k:
                ids.append(self.tokenizer.eos_token_id)
            ids += self.tokenizer(piece, add_special_tokens=False)["input_ids"]
        return ids

    def generate(
        self,
        model,
        tokenizer,
        prompt_token_ids,
        n,
        sampling,
        *,
        eos_token_ids,
        pad_token_id,
        max_new_tokens=None,
        generator=None,
    ):
        caps = list(max_new_tokens) if max_new_tokens is not None else [sampling.max_new_tokens] * len(prompt_token_ids)
        self.calls.append(
            {"prompts": [list(p) for p in prompt_token_ids], "n": n, "caps": caps, "stop": list(sampling.stop_strings)}
        )
        responses, log_probs, truncated, by_string = [], [], [], []
        for prompt, cap in zip(prompt_token_ids, caps, strict=True):
            planned = self.continuation(list(prompt))
            tokens, ended = [], "cap"
            for token in planned[:cap]:
                tokens.append(token)
                if token in eos_token_ids:
                    ended = "eos"
                    break
                if any(s in tokenizer.decode(tokens, skip_special_tokens=True) for s in sampling.stop_strings):
                    ended = "stop"
                    break
            for _ in range(n):
                responses.append(tokens)
                log_probs.append([sampled_log_prob(i) for i in range(len(tokens))])
                truncated.append(ended == "cap")
                by_string.append(ended == "stop")
        ids, mask, values = response_tensors(responses, log_probs, pad_token_id, torch.device("cpu"))
        return GenerationOutput(
            response_ids=ids,
            response_mask=mask,
            truncated=torch.tensor(truncated),
            log_probs=values,
            stopped_by_string=torch.tensor(by_string),
            seconds=0.0,
            steps=max(len(r) for r in responses),
        )
