"""The pure pieces of the sampling loop."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.generation.loop import left_pad, position_ids_from_mask
from rlvr_lightning.generation.output import StopStringChecker
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.generation.token_sampling import _sample_categorical, filter_logits, sample_next_token


def test_left_pad_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert position_ids_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_categorical_sampling_matches_probabilities():
    torch.manual_seed(0)
    probs = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.3])
    draws = _sample_categorical(probs.expand(40_000, -1))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    assert freq[0] == 0 and freq[3] == 0
    assert (freq - probs).abs().max() < 0.01


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.isfinite(filter_logits(logits, top_k=2)).tolist() == [[True, True, False, False]]
    # 0.5 + 0.25 covers 0.7: the nucleus is the first two
    assert torch.isfinite(filter_logits(logits, top_p=0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.76)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_logits(logits, top_p=0.1)).tolist() == [[True, False, False, False]]
    # unsorted input keeps the same tokens
    shuffled = logits[:, [2, 0, 3, 1]]
    assert torch.isfinite(filter_logits(shuffled, top_p=0.7)).tolist() == [[False, True, False, True]]


def test_min_p_filtering_by_hand_and_against_transformers_warpers():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    # kept: p >= min_p * 0.5; min_p 0.3 -> p >= 0.15; 0.5 -> p >= 0.25; 1 -> the likeliest alone
    assert torch.isfinite(filter_logits(logits, min_p=0.3)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_logits(logits, min_p=0.5)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logits, min_p=1.0)).tolist() == [[True, False, False, False]]
    # after top-p 0.76 kept (0.5, 0.25, 0.15), renormalised: min-p compares with the likeliest kept, the same ratios
    assert torch.isfinite(filter_logits(logits, top_p=0.76, min_p=0.35)).tolist() == [[True, True, False, False]]
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    generator = torch.Generator().manual_seed(0)
    for top_k, top_p, min_p in [(0, 1.0, 0.05), (0, 1.0, 0.3), (20, 1.0, 0.1), (0, 0.9, 0.1), (8, 0.8, 0.2)]:
        logits = torch.randn(16, 64, generator=generator) * 3
        warpers = [TopKLogitsWarper(top_k)] if top_k else []
        warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
        warpers.append(MinPLogitsWarper(min_p))
        expected = LogitsProcessorList(warpers)(torch.zeros(16, 1, dtype=torch.long), logits.clone())
        ours = filter_logits(logits, top_k=top_k, top_p=top_p, min_p=min_p)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(expected)), (top_k, top_p, min_p)


def test_min_p_samples_only_the_kept_tokens_and_records_unfiltered_log_probs():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1])).expand(20_000, -1)
    tokens, log_probs = sample_next_token(logits, min_p=0.3)
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    # renormalised over the kept 0.9: 0.556, 0.278, 0.167, 0
    assert freq[3] == 0 and (freq[:3] - torch.tensor([0.5, 0.25, 0.15]) / 0.9).abs().max() < 0.01
    assert torch.allclose(log_probs, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))
    with pytest.raises(ValueError, match=r"min_p=1\.5 is not valid"):
        SamplingConfig(min_p=1.5)
    assert SamplingConfig(min_p=0.1).filters and not SamplingConfig(min_p=0.1, do_sample=False).filters


@pytest.mark.parametrize("top_k, temperature", [(3, 0.5), (0, 0.5), (0, 1.0)])
def test_sample_next_token_log_probs_are_unfiltered(top_k, temperature):
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    tokens, log_probs = sample_next_token(logits, temperature=temperature, top_k=top_k)
    expected = torch.log_softmax(logits / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(log_probs, expected, atol=1e-5)
    if top_k:
        assert (tokens[:, None] == logits.topk(top_k).indices).any(-1).all()


def test_suppressed_tokens_are_never_sampled_but_keep_their_probability_mass():
    torch.manual_seed(0)
    logits = torch.zeros(200, 4)
    logits[:, 2] = 5.0  # token 2 would win almost always
    tokens, log_probs = sample_next_token(logits, suppress=torch.tensor([2]))
    assert not (tokens == 2).any()
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(log_probs, expected, atol=1e-6)
    greedy, _ = sample_next_token(logits, do_sample=False, suppress=torch.tensor([2]))
    assert (greedy == 0).all()  # the argmax among the rest (ties: the first)


def test_stop_string_cut():
    checker = StopStringChecker(["</answer>", "\n\n"], decode=lambda rows: ["".join(map(chr, r)) for r in rows])
    assert checker.cut("x</answer> tail") == ("x</answer>", True)
    assert checker.cut("a\n\nb</answer>") == ("a\n\n", True)
    assert checker.cut("nothing") == ("nothing", False)
    assert checker.check([[ord(c) for c in "ab</answer>"], [ord("a")]]) == [True, False]
    assert not StopStringChecker([], decode=lambda rows: [])


def test_the_decode_loop_reports_its_tokens(make_policy):
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.runtime.stage_reports import listening

    class Recorder:
        def __init__(self):
            self.tokens = []

        def on_stage(self, stage):
            pass

        def on_tokens(self, done, total):
            self.tokens.append((done, total))

    with listening(Recorder()) as recorder:
        make_policy().sample({"prompt": ["What is 2+3?"]}, 2, SamplingConfig(max_new_tokens=5, min_new_tokens=5))
    assert recorder.tokens == [(i, 5) for i in range(1, 6)]
