"""Is a sampler's distribution of completions the model's? Chi-square tests on what completions look like.

A completion is summarised by three categorical variables: its first token, its second token (a category of its
own when the completion ended after one), and its length class (1..L when it ended with EOS, L + 1 when
`max_new_tokens` = L cut it). The first token is drawn from the prompt's forward alone; the second already
depends on the cache of the prompt and the first token; the length on every step. Two samplers agree when each
variable has the same distribution under both: `homogeneity_chi2` tests that on two samples of counts, and
`chi2_threshold(df)` is the statistic that two samples of one distribution exceed with probability 1e-4.

The ground truth is `reference_sample`: plain `model(...)` calls on the whole sequence at every step (no KV
cache, no padding, no sharing) and `torch.multinomial` on the softmax of the last position's logits.

A random tiny Llama samples almost uniformly over its vocabulary and almost never EOS; `peak_distribution`
rescales its output layer so that some 10-30 tokens are plausible at each step and EOS has a sizeable
probability, so both the tokens and the length vary and a wrong sampler shows in them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

# the standard normal's upper 1e-4 quantile: Phi^-1(1 - 1e-4)
Z_UPPER_1E4 = 3.719016485455709


def chi2_upper_quantile(df: int, z: float = Z_UPPER_1E4) -> float:
    """The chi-square(df) quantile above which a fraction Phi(-z) of the mass lies, by Wilson and Hilferty's
    cube-root normal approximation (Wilson & Hilferty 1931, PNAS 17:684): k * (1 - 2/(9k) + z * sqrt(2/(9k)))^3.
    At the 1e-4 tail it errs on the high side (30.4 against the exact 29.9 for 7 degrees of freedom, 67.9
    against 67.6 for 30; checked for 1 to 400 degrees of freedom in the tests), so a correct sampler fails with
    probability below 1e-4."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def homogeneity_chi2(a: Tensor, b: Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's chi-square statistic of the 2 x K table of counts `a` and `b` (are they draws from one
    distribution?), and its degrees of freedom. Categories whose expected count is below `min_expected` in
    either sample are merged into one (the usual validity rule of the chi-square approximation)."""
    a, b = a.double(), b.double()
    n_a, n_b = a.sum(), b.sum()
    pooled = a + b
    small = (pooled * torch.minimum(n_a, n_b) / (n_a + n_b)) < min_expected
    if small.any():
        a = torch.cat([a[~small], a[small].sum().view(1)])
        b = torch.cat([b[~small], b[small].sum().view(1)])
        pooled = a + b
        keep = pooled > 0
        a, b, pooled = a[keep], b[keep], pooled[keep]
    # sum_k (O - E)^2 / E over both rows, E = row total x column total / grand total, which for two rows is
    # sum_k (n_b a_k - n_a b_k)^2 / (n_a n_b (a_k + b_k))
    statistic = ((n_b * a - n_a * b) ** 2 / (n_a * n_b * pooled)).sum()
    return float(statistic), int(a.numel()) - 1


def chi2_threshold(df: int) -> float:
    return chi2_upper_quantile(max(df, 1))


class Completions:
    """First and second tokens and length classes of a sample of completions, with their counts."""

    def __init__(
        self, first: Tensor, second: Tensor, length_class: Tensor, vocab_size: int, max_new_tokens: int
    ) -> None:
        self.first = first.long()
        self.second = torch.where(length_class == 1, vocab_size, second.long())  # ended after one token: category V
        self.length_class = length_class.long()
        self.vocab_size = vocab_size
        self.max_new_tokens = max_new_tokens

    def __len__(self) -> int:
        return int(self.first.numel())

    def first_counts(self) -> Tensor:
        return torch.bincount(self.first, minlength=self.vocab_size)

    def second_counts(self) -> Tensor:
        return torch.bincount(self.second, minlength=self.vocab_size + 1)

    def length_counts(self) -> Tensor:
        return torch.bincount(self.length_class - 1, minlength=self.max_new_tokens + 1)

    @classmethod
    def from_rollout_rows(cls, rollout, rows: Tensor, vocab_size: int, max_new_tokens: int) -> Completions:
        lengths = rollout.response_mask[rows].sum(-1).long()
        length_class = torch.where(rollout.truncated[rows], max_new_tokens + 1, lengths)
        second = rollout.response_ids[rows, 1] if rollout.response_ids.shape[1] > 1 else torch.zeros_like(lengths)
        return cls(rollout.response_ids[rows, 0], second, length_class, vocab_size, max_new_tokens)


VARIABLES = {
    "first_token": Completions.first_counts,
    "second_token": Completions.second_counts,
    "length": Completions.length_counts,
}


def compare(a: Completions, b: Completions) -> dict[str, tuple[float, float]]:
    """{"first_token" | "second_token" | "length": (chi-square statistic of `a` against `b`, threshold)}."""
    results = {}
    for name, counts in VARIABLES.items():
        statistic, df = homogeneity_chi2(counts(a), counts(b))
        results[name] = (statistic, chi2_threshold(df))
    return results


LAYOUTS = ("one_group", "groups_of_16", "no_sharing", "left_padded")


def policy_sample(
    policy,
    prompt: list[int],
    layout: str,
    num_samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    longer_prompts: Sequence[list[int]] = (),
) -> Completions:
    """`num_samples` completions of `prompt` from `policy.sample`, the prompt laid out in the batch as
    `layout` says: "one_group" (one prompt, n = num_samples: one prefill, its cache repeated), "groups_of_16",
    "no_sharing" (the prompt num_samples times, n = 1: every row prefills on its own) or "left_padded" (copies
    of the prompt between two `longer_prompts`, groups of num_samples / 100)."""
    if layout == "one_group":
        prompts, n = [prompt], num_samples
    elif layout == "groups_of_16":
        prompts, n = [prompt] * (num_samples // 16), 16
    elif layout == "no_sharing":
        prompts, n = [prompt] * num_samples, 1
    elif layout == "left_padded":
        if len(longer_prompts) != 2 or min(map(len, longer_prompts)) <= len(prompt):
            raise ValueError("the left_padded layout needs two prompts longer than the prompt")
        prompts, n = [longer_prompts[0], *[prompt] * 50, longer_prompts[1], *[prompt] * 50], num_samples // 100
    else:
        raise ValueError(f"layout={layout!r} is not valid; choose one of {list(LAYOUTS)}")
    from rlvr_lightning.generation.sampling_config import SamplingConfig

    sampling = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens)
    rollout = policy.sample({"prompt": prompts}, n, sampling, generator=torch.Generator().manual_seed(seed))
    rows = torch.tensor([p == prompt for p in prompts]).repeat_interleave(n).nonzero().squeeze(-1)
    assert rows.numel() == num_samples
    return Completions.from_rollout_rows(rollout, rows, policy.hf_config.vocab_size, max_new_tokens)


@torch.no_grad()
def reference_sample(
    model: nn.Module,
    prompt: Sequence[int],
    num_samples: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    chunk: int = 5000,
) -> Completions:
    """`num_samples` completions of one prompt, each step a full forward of prompt + tokens so far."""
    was_training = model.training
    model.eval()
    eos = torch.as_tensor(list(eos_token_ids))
    firsts, seconds, classes = [], [], []
    try:
        for start in range(0, num_samples, chunk):
            rows = min(chunk, num_samples - start)
            sequences = torch.as_tensor(list(prompt)).repeat(rows, 1)
            length_class = torch.full((rows,), max_new_tokens + 1)
            alive = torch.arange(rows)  # rows still generating
            for step in range(max_new_tokens):
                logits = model(input_ids=sequences[alive]).logits[:, -1].float()
                tokens = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator).squeeze(-1)
                column = torch.zeros(rows, dtype=torch.long)
                column[alive] = tokens
                sequences = torch.cat([sequences, column.unsqueeze(-1)], dim=1)
                ended = torch.isin(tokens, eos)
                length_class[alive[ended]] = step + 1
                alive = alive[~ended]
                if not alive.numel():
                    break
            firsts.append(sequences[:, len(prompt)])
            ended_at_once = sequences.shape[1] == len(prompt) + 1
            seconds.append(torch.zeros(rows, dtype=torch.long) if ended_at_once else sequences[:, len(prompt) + 1])
            classes.append(length_class)
    finally:
        model.train(was_training)
    vocab_size = model.get_output_embeddings().weight.shape[0]
    return Completions(torch.cat(firsts), torch.cat(seconds), torch.cat(classes), vocab_size, max_new_tokens)


@torch.no_grad()
def peak_distribution(model: nn.Module, eos_token_id: int, logit_scale: float = 20.0, eos_weight: float = 2.5) -> None:
    """Rescale a random Llama in place so that its next-token distribution is neither uniform nor degenerate.

    The output layer is multiplied by `logit_scale` (some 10-30 plausible tokens instead of the whole vocabulary);
    hidden dimension 0 of every token embedding is set to a constant, which survives the residual stream and
    the final RMSNorm, and only EOS's output row reads it (`eos_weight`): EOS gets a logit bonus of about 7 at
    every position, whatever the context, so that most completions end within 8 tokens, at varied lengths."""
    embeddings = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    head.mul_(logit_scale)
    embeddings[:, 0] = 5 * embeddings[:, 1:].std()
    head[:, 0] = 0.0
    head[eos_token_id, 0] = eos_weight
