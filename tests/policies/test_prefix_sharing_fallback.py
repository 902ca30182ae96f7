"""Scoring with a group's prompt run once falls back to the joint forward, for good, when the model's key/value
cache proves to hold other layers than plain full-attention ones (a sliding window or linear attention that the
config did not announce)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from rlvr_lightning.generation.sampling_config import SamplingConfig
from tests.policies.comparisons import masked_max_diff

PROMPTS = ["What is 2+3?", "Hi", "Think step by step, then answer: what is the sum of 7 and 12?"]


class _WindowLayer(DynamicLayer):
    """Stands for a cache layer that is not a plain one (the check is by exact type)."""


def test_a_cache_that_is_not_plain_turns_prompt_sharing_off_and_scores_as_the_joint_forward(make_policy):
    policy = make_policy()
    policy.share_prompt_prefix = True
    torch.manual_seed(0)
    rollout = policy.sample({"prompt": PROMPTS}, n=4, sampling=SamplingConfig(max_new_tokens=6))
    policy.share_prompt_prefix = False
    joint = policy.token_log_probs(rollout)[0].detach()

    run, widths = policy._run, []

    def run_with_window_layers(*args, **inputs):
        widths.append(inputs["input_ids"].shape[0])
        out = run(*args, **inputs)
        for layer in getattr(out.cache, "layers", []):
            layer.__class__ = _WindowLayer
        return out

    policy._run = run_with_window_layers
    policy.share_prompt_prefix = True
    first = policy.token_log_probs(rollout)[0].detach()
    assert widths == [len(PROMPTS), rollout.num_rows]  # the prompts once, then the joint forward
    assert policy._prefix_sharing is False
    widths.clear()
    second = policy.token_log_probs(rollout)[0].detach()
    assert widths == [rollout.num_rows]  # not tried again
    for scores in (first, second):
        assert masked_max_diff(scores, joint, rollout.response_mask) < 1e-6
