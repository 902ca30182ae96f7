"""`bench_step.py --case natural`: the update and scoring passes of one GRPO step on completions of natural, very
uneven lengths, with micro-batches of rows padded to the longest (`update.micro_batch_size`) against packed,
padding-free micro-batches of at most `micro_batch_tokens` tokens (`update.micro_batch_tokens`).

The rollout is sampled once, with EOS allowed: the tiny Llama's EOS logit is raised by a fixed bias, so responses
end after a geometric number of tokens (mean ~1/p) or at `new_tokens`. Both legs then replay that same rollout
(same tokens, lengths, advantages) from the same weights: old log-probs (two mini-batches, so the update reads
them), reference log-probs (KL in the loss), entropy bonus, and the update (PPO-clip, token-mean, AdamW, clip 1).
The legs alternate (padded, packed, padded, ...) in one process with one torch thread; each pair gives a ratio,
and the script prints the medians of wall and process CPU time (`_cpu`: far less disturbed by other processes on
a shared machine), the ratios' median and spread (min, max), and the largest difference of the two legs' losses.
TRL's `GRPOTrainer` samples its own completions and cannot replay given ones: not measured.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time

import torch

from rlvr_lightning.core.losses.policy_losses import PPOClip
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions


class _Module:
    """What `PolicyUpdate.run` asks of the Lightning module, on one process."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer
        self.trainer = type("Trainer", (), {"strategy": None})()

    def optimizers(self):
        return self.optimizer

    def lr_schedulers(self):
        return None

    def manual_backward(self, loss):
        loss.backward()

    def clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)


def sample_natural_rollout(policy, case: dict, seed: int):
    """One rollout with EOS allowed, its EOS logit raised by `case["eos_bias"]` (uneven, natural lengths)."""
    from rlvr_lightning.demos.tiny_lm import bias_tokens
    from rlvr_lightning.rollout import Rollout

    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=case["new_tokens"])
    handle = bias_tokens(policy, [policy.tokenizer.eos_token_id], case["eos_bias"])
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            rollout = policy.sample(
                {"prompt": case["prompts"], "metadata": [{}] * len(case["prompts"])}, case["generations"], sampling
            )
    finally:
        handle.remove()
    rollout.advantages = torch.randn(rollout.num_rows, generator=torch.Generator().manual_seed(seed))
    assert isinstance(rollout, Rollout)
    return rollout, sampling


def _leg(policy, reference, weights, rollout, sampling, update: UpdateConfig, lr: float) -> dict:
    """One replay: the old and reference log-probs, then the update; times and the loss."""
    policy.load_state_dict(weights)
    policy.packed_sequences = False  # the update turns it on when it packs
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    passes = PolicyUpdate(
        policy,
        PPOClip(clip_low=0.2, clip_high=0.2),
        AggregationConfig(mode="token-mean"),
        KLConfig(coef=0.05),
        reference,
        ImportanceSamplingConfig(),
        update,
        entropy_coef=0.001,
        sampling=sampling,
    )
    replay = rollout.select(torch.arange(rollout.num_rows))  # a copy: the inputs are added to it
    replay.old_log_probs = None
    torch.manual_seed(0)  # the same mini-batch order
    t0, c0 = time.perf_counter(), time.process_time()
    passes.add_old_and_reference_log_probs(replay)
    t1, c1 = time.perf_counter(), time.process_time()
    metrics = passes.run(replay, _Module(optimizer))
    t2, c2 = time.perf_counter(), time.process_time()
    return {
        "scoring": t1 - t0,
        "update": t2 - t1,
        "total": t2 - t0,
        "scoring_cpu": c1 - c0,
        "update_cpu": c2 - c1,
        "total_cpu": c2 - c0,
        "loss": float(metrics["train/loss"]),
    }


def run_natural(model_dir, case: dict, rounds: int, seed: int, lr: float) -> dict:
    """Sample once, then `rounds` interleaved pairs of legs; the summary the script prints."""
    from rlvr_lightning.policies.hf import HFPolicy

    policy = HFPolicy(
        model=HFModelOptions(name_or_path=str(model_dir), dtype="float32", attn_implementation="sdpa"),
        prompt=PromptOptions(template=case["template"]),
    )
    rollout, sampling = sample_natural_rollout(policy, case, seed)
    reference = policy.create_reference()
    weights = copy.deepcopy(policy.state_dict())
    mini_batch = rollout.num_rows // 2
    legs = {
        "padded": UpdateConfig(mini_batch_size=mini_batch, micro_batch_size=case["micro_batch"], max_grad_norm=1.0),
        "packed": UpdateConfig(
            mini_batch_size=mini_batch, micro_batch_tokens=case["micro_batch_tokens"], max_grad_norm=1.0
        ),
    }
    run = functools.partial(_leg, policy, reference, weights, rollout, sampling, lr=lr)
    run(legs["packed"])  # warm-up (allocator, kernels), not counted
    results: dict[str, list[dict]] = {name: [] for name in legs}
    for _ in range(rounds):
        for name, update in legs.items():
            results[name].append(run(update))
    lengths = rollout.response_mask.sum(-1)
    prompt = rollout.prompt_mask.sum(-1)
    return {
        "rows": rollout.num_rows,
        "response_lengths": {
            "min": int(lengths.min()),
            "median": float(lengths.median()),
            "max": int(lengths.max()),
            "mean": float(lengths.mean()),
        },
        "prompt_tokens": [int(prompt.min()), int(prompt.max())],
        "positions": {
            "padded": padded_positions(rollout, case["micro_batch"]),
            "packed": int((prompt + lengths).sum()),
        },
        "legs": results,
    }


def padded_positions(rollout, micro_batch: int) -> int:
    """Positions of the padded micro-batches: rows x (prompt width + longest response) of each, as the padded
    forward trims them (before prefix sharing, which runs each distinct prompt once)."""
    total = 0
    for start in range(0, rollout.num_rows, micro_batch):
        prompt = rollout.prompt_mask[start : start + micro_batch].bool()
        response = rollout.response_mask[start : start + micro_batch].bool()
        width = int(prompt.any(0).sum()) + int(response.any(0).nonzero().max()) + 1
        total += prompt.shape[0] * width
    return total


def natural_case(name: str, case: dict, args, tmp) -> dict:
    """`bench_step.py --case natural`: build the tiny model, run the interleaved legs, print the summary."""
    from bench_step_cases import LR, make_tiny_model

    model_dir = make_tiny_model(tmp / "tiny")
    rounds = args.steps or 7
    result = run_natural(model_dir, case, rounds, args.seed, LR)
    print(f"\n== {name}: ours padded vs ours packed, {args.threads} thread(s), {rounds} interleaved rounds")
    for line in summarize(result, case):
        print(line)
    return result


def summarize(result: dict, case: dict) -> list[str]:
    """The printed lines of `run_natural`'s result."""
    legs = result["legs"]
    lines = []
    lengths = result["response_lengths"]
    lines.append(
        f"{result['rows']} rows; responses {lengths['min']}-{lengths['max']} tokens (median {lengths['median']:.0f}, "
        f"mean {lengths['mean']:.1f}); prompts {result['prompt_tokens'][0]}-{result['prompt_tokens'][1]} tokens; "
        f"padded micro-batches of {case['micro_batch']} rows, packed of <= {case['micro_batch_tokens']} tokens; "
        f"positions in the padded tensors {result['positions']['padded']}, real {result['positions']['packed']}"
    )
    keys = ("scoring", "update", "total", "scoring_cpu", "update_cpu", "total_cpu")
    lines.append("".join(f"{k:>12}" for k in ("", *keys)) + f"   (median seconds over {len(legs['padded'])} rounds)")
    for name, runs in legs.items():
        lines.append(f"{name:>12}" + "".join(f"{statistics.median(r[k] for r in runs):>12.3f}" for k in keys))
    for key in keys:
        ratios = [a[key] / b[key] for a, b in zip(legs["padded"], legs["packed"], strict=True)]
        lines.append(
            f"padded / packed {key}: median {statistics.median(ratios):.2f}x (pairs: min {min(ratios):.2f}x, "
            f"max {max(ratios):.2f}x)"
        )
    differences = [abs(a["loss"] - b["loss"]) for a, b in zip(legs["padded"], legs["packed"], strict=True)]
    lines.append(
        f"loss: padded {legs['padded'][0]['loss']:.8f}, packed {legs['packed'][0]['loss']:.8f}, "
        f"largest difference {max(differences):.2e}"
    )
    lines.append("trl: not measured (GRPOTrainer samples its own completions; it cannot replay these lengths)")
    return lines
