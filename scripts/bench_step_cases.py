"""What `bench_step.py` measures on both sides: its cases (prompts, group size, response length), the
shared reward, the per-section step timer, and the models (a tiny Llama saved to a directory, or SmolLM2)."""

from __future__ import annotations

import functools
import resource
import statistics
import time
from collections import defaultdict
from pathlib import Path

import step_profile
import torch

from rlvr_lightning.runtime.timing import clock  # waits for the device's queued work before reading the time

LR = 1e-5
SECTIONS = ("generation", "reward", "logprob_forward", "backward", "optimizer")
#: the step (0-based) a leg records with `torch.profiler` (`step_profile.py`, `BENCH_PROFILE=1`; None: none), and
#: the leg's name in its report
PROFILE_STEP: int | None = None
PROFILE_LABEL = ""

PAIRS = [(3, 4), (12, 7), (25, 17), (8, 9), (101, 5), (64, 36), (7, 70), (250, 250)]
# "task": an RLVR-style prompt (instruction + question, ~40 tokens); "short": the bare question (~10 tokens)
TINY_PROMPTS = {
    "task": [f"Give the final answer after 'The answer is'.\nQuestion: What is {a} + {b}?\nAnswer:" for a, b in PAIRS],
    "short": [f"What is {a} + {b}? The answer is" for a, b in PAIRS],
}
SMOL_PROMPTS = ["What is 12 + 7? Answer with a number.", "Name a prime number larger than 10."]
SMOL_PROMPTS_8 = SMOL_PROMPTS + [
    "What is 9 times 8?",
    "Spell the word cat backwards.",
    "What is the capital of France?",
    "Give an even number between 21 and 25.",
    "How many days are in a week?",
    "What is 100 minus 37?",
]

CASES = {
    "tiny": {"prompts": TINY_PROMPTS["task"], "generations": 8, "new_tokens": 16, "template": "raw"},
    "smollm2": {"prompts": SMOL_PROMPTS, "generations": 8, "new_tokens": 32, "template": "chat"},
    # 64 x 171 positions at once need > 20 GB on either side: 4 micro-batches of 16 rows, one optimizer step
    "smollm2_long": {
        "prompts": SMOL_PROMPTS_8,
        "generations": 8,
        "new_tokens": 128,
        "template": "chat",
        "micro_batch": 16,
    },
    # natural lengths (EOS allowed, raised so responses end after ~1/p tokens): ours padded vs packed on the update
    # and scoring passes of one replayed rollout (scripts/bench_step_packing.py)
    "natural": {
        "prompts": TINY_PROMPTS["task"],
        "generations": 8,
        "new_tokens": 256,
        "template": "raw",
        "natural_lengths": True,
        "eos_bias": 2.5,
        "micro_batch": 16,
        "micro_batch_tokens": 512,  # ~2x the longest row: the sdpa mask's cost grows with its square
    },
}


def digit_reward(text: str) -> float:
    """The shared reward: the fraction of characters that are digits."""
    return sum(c.isdigit() for c in text) / max(len(text), 1)


# ----------------------------------------------------------------------------- timing


def profiled_steps(steps: int, label: str) -> int:
    """The steps a leg runs: with `BENCH_PROFILE=1` one more (its last), which `StepTimer` has `torch.profiler`
    record and report as `label`; the leg then leaves it out of the steps it writes."""
    global PROFILE_STEP, PROFILE_LABEL
    if not step_profile.profiling():
        return steps
    PROFILE_STEP, PROFILE_LABEL = steps, label
    return steps + 1


class StepTimer:
    """Per-step wall time and time spent inside wrapped functions (sections), on `device`'s clock."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = defaultdict(float)
        self.started = 0.0
        self.device = device
        self.profiler = None

    def wrap(self, obj, attr: str, section: str) -> None:
        fn = getattr(obj, attr)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0, c0 = clock(self.device), time.process_time()
            try:
                with torch.profiler.record_function(step_profile.SECTION_MARK + section):
                    return fn(*args, **kwargs)
            finally:
                self.current[section] += clock(self.device) - t0
                self.current[f"{section}_cpu"] += time.process_time() - c0

        setattr(obj, attr, timed)

    def begin(self) -> None:
        if PROFILE_STEP is not None and len(self.steps) == PROFILE_STEP:
            self.profiler = step_profile.start(str(self.device))
        self.current = defaultdict(float)
        self.started = clock(self.device)
        self.started_cpu = time.process_time()

    def end(self) -> None:
        total = clock(self.device) - self.started
        step = {"step": total, **self.current, "cpu": time.process_time() - self.started_cpu}
        step["other"] = total - sum(self.current.get(s, 0.0) for s in SECTIONS)
        step["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak so far
        self.steps.append(step)
        if self.profiler is not None:
            step_profile.finish(self.profiler, str(self.device), PROFILE_LABEL)
            self.profiler = None

    def medians(self, warmup: int) -> dict[str, float]:
        kept = self.steps[warmup:] or self.steps
        keys = ["step", *SECTIONS, "other", "cpu", "generation_cpu"]
        medians = {k: statistics.median(s.get(k, 0.0) for s in kept) for k in keys}
        return {**medians, "peak_rss_mb": max(s.get("peak_rss_mb", 0.0) for s in self.steps)}


# ----------------------------------------------------------------------------- models


def make_tiny_model(directory: Path, seed: int = 0) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr_lightning.demos.tiny_lm import bench_corpus, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(vocab_size=512, corpus=bench_corpus())
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def smollm2_dir() -> Path:
    from rlvr_lightning.runtime.model_cache import is_fetched, model_dir

    if not is_fetched("smollm2-135m-instruct"):
        raise SystemExit("SmolLM2 is not fetched: run `rlvr-models fetch smollm2-135m-instruct` first")
    return model_dir("smollm2-135m-instruct")


def prompt_lengths(model_dir: Path, case: dict) -> list[int]:
    """The token count of each of the case's prompts as both sides feed it (its chat template where it has one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if case["template"] == "chat":
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in case["prompts"]
        ]
        return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return [len(tokenizer(p)["input_ids"]) for p in case["prompts"]]
