"""`bench_step.py`'s TRL leg: one `GRPOTrainer` run on a case's work, timed per section like our loop."""

from __future__ import annotations

from pathlib import Path

import torch
from bench_step_cases import LR, StepTimer, digit_reward, prompt_lengths

from rlvr_lightning.runtime.timing import clock  # waits for the device's queued work before reading the time


def paged_cache_for(model_dir: Path, case: dict, block_size: int = 256) -> dict:
    """Continuous batching's paged cache and batch sized to one step: every prompt prefilled in one forward (TRL's
    default sizes both to half the device's memory: 12 GB of a 24 GB host, whose allocation made a tiny step take
    20-27 s on a CPU)."""
    rows, longest = len(case["prompts"]) * case["generations"], max(prompt_lengths(model_dir, case))
    blocks_per_row = -(-(longest + case["new_tokens"]) // block_size)
    return {"block_size": block_size, "num_blocks": rows * blocks_per_row, "max_batch_tokens": rows * longest}


def run_trl(
    model_dir: Path,
    case: dict,
    steps: int,
    seed: int,
    output_dir: str,
    bf16: bool = False,
    device: str = "cpu",
    continuous_batching: bool = False,
) -> StepTimer:
    """`bf16`: GRPOConfig(bf16=True), the Trainer's bf16 autocast over fp32 weights (on a CPU too), else fp32.
    `continuous_batching`: TRL's generation through transformers' continuous batching (`generate_batch`)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    timer = StepTimer(device)
    lengths: list[int] = []

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timer.begin()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.t0 = clock(timer.device)

        def on_optimizer_step(self, args, state, control, **kwargs):
            timer.current["optimizer"] += clock(timer.device) - self.t0

        def on_step_end(self, args, state, control, **kwargs):
            timer.end()

    def reward(completions, completion_ids=None, **kwargs):
        lengths.extend(len(ids) for ids in completion_ids)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [digit_reward(t) for t in texts]

    prompts = case["prompts"]
    rows = prompts * (steps + 2)
    if case["template"] == "chat":
        rows = [[{"role": "user", "content": p}] for p in rows]
    dataset = Dataset.from_dict({"prompt": rows})
    new_tokens, group = case["new_tokens"], case["generations"]
    args = GRPOConfig(
        output_dir=output_dir,
        # completions per optimizer step: micro-batches x accumulation steps, generated at once
        per_device_train_batch_size=case.get("micro_batch") or len(prompts) * group,
        gradient_accumulation_steps=len(prompts) * group // (case.get("micro_batch") or len(prompts) * group),
        num_generations=group,
        max_completion_length=new_tokens,
        # every completion `new_tokens` long; continuous batching ignores `min_new_tokens`, and -1 turns EOS off there
        generation_kwargs={"eos_token_id": -1} if continuous_batching else {"min_new_tokens": new_tokens},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the rollout, like aggregation="token-mean"
        scale_rewards="group",
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        gradient_checkpointing=False,  # TRL defaults to True (memory for time); its fastest setting is off
        max_grad_norm=1.0,
        max_steps=steps,
        use_cpu=device == "cpu",
        bf16=bf16,
        fp16=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
        shuffle_dataset=False,
        use_transformers_continuous_batching=continuous_batching,
        transformers_continuous_batching_config=paged_cache_for(model_dir, case) if continuous_batching else None,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Timing()],
    )
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)  # the per-step log dicts (still computed: logging_steps=1)
    trainer.remove_callback(ProgressCallback)
    timer.wrap(trainer, "_generate", "generation")
    timer.wrap(trainer, "_calculate_rewards", "reward")
    timer.wrap(trainer, "_get_per_token_logps_and_entropies", "logprob_forward")
    timer.wrap(trainer.accelerator, "backward", "backward")
    timer.wrap(trainer, "_clip_grad_norm", "optimizer")
    trainer.train()
    assert set(lengths) == {new_tokens}, sorted(set(lengths))
    return timer
