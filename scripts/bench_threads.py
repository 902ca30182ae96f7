#!/usr/bin/env python
"""One torch thread or two: a SmolLM2 training step's core, timed with and without a competing job.

The proxy step is the demo's (`configs/smollm2_demo.yaml`) work at a shorter length: SmolLM2-135M-Instruct
samples `--new_tokens` tokens (EOS suppressed until then) for 2 chat prompts x 4 completions, then a
log-prob forward and backward over the completions. Each round times it once per thread count, in
alternating order, in two conditions:

  quiet  as the machine is (the load average of other jobs is printed alongside)
  load   plus one competing job: a process multiplying 512 x 512 matrices with one thread, nonstop

Prints per condition and thread count the median wall time of the rounds, and the ratio two threads / one.

    rlvr-models fetch smollm2-135m-instruct      # once
    python scripts/bench_threads.py --rounds 3 --new_tokens 8
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rlvr_lightning.policies.hf_options import HFModelOptions, PromptOptions

PROMPTS = ["What is 12 + 7?", "What is 9 + 6?"]


def competing_job(stop) -> None:
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def proxy_step(policy, sampling) -> float:

    started = time.perf_counter()
    rollout = policy.sample({"prompt": PROMPTS, "metadata": [{}, {}]}, 4, sampling)
    log_probs, _ = policy.token_log_probs(rollout, sampling.temperature)
    (-(log_probs * rollout.response_mask).sum()).backward()
    policy.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new_tokens", type=int, default=8)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--conditions", nargs="+", default=["quiet", "load"], choices=["quiet", "load"])
    args = parser.parse_args()

    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy

    torch.manual_seed(0)
    policy = HFPolicy(
        model=HFModelOptions(name_or_path=args.model, dtype="float32"), prompt=PromptOptions(template="chat")
    )
    sampling = SamplingConfig(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
    torch.set_num_threads(1)
    proxy_step(policy, sampling)  # warm-up
    results: dict[tuple[str, int], list[float]] = {}
    for condition in args.conditions:
        stop = mp.Event()
        job = (
            mp.get_context("fork").Process(target=competing_job, args=(stop,), daemon=True)
            if condition == "load"
            else None
        )
        if job is not None:
            job.start()
            time.sleep(1.0)
        for round_index in range(args.rounds):
            order = (1, 2) if round_index % 2 == 0 else (2, 1)
            for threads in order:
                torch.set_num_threads(threads)
                seconds = proxy_step(policy, sampling)
                results.setdefault((condition, threads), []).append(seconds)
                print(
                    f"{condition} round {round_index} threads {threads}: {seconds:.2f} s "
                    f"(load average {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
        if job is not None:
            stop.set()
            job.join(timeout=10)
    print("\ncondition  threads  median s  (rounds)")
    for condition in args.conditions:
        one, two = (statistics.median(results[(condition, t)]) for t in (1, 2))
        for threads, median in ((1, one), (2, two)):
            runs = ", ".join(f"{s:.1f}" for s in results[(condition, threads)])
            print(f"{condition:9s}  {threads:7d}  {median:8.2f}  ({runs})")
        print(f"{condition:9s}  two threads / one: {two / one:.2f}x")


if __name__ == "__main__":
    main()
