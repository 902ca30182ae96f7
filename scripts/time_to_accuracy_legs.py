"""The legs of `bench_time_to_accuracy.py`: our `rlvr fit` and TRL's `GRPOTrainer` on the SmolLM2 arithmetic
recipe, each evaluated by the same held-out greedy evaluator with the clock stopped while it runs.

    python scripts/time_to_accuracy_legs.py ours --out DIR --seed 0 --steps 100 --eval_every 10 --num_eval 100
    python scripts/time_to_accuracy_legs.py trl  --out DIR --seed 0 --steps 100 --eval_every 10 --num_eval 100
    python scripts/time_to_accuracy_legs.py distill --teacher DIR/ours_s0/checkpoints/final.ckpt --out DIR ...
    python scripts/time_to_accuracy_legs.py ours_bf16 --out DIR --seed 0 --steps 40   # our leg, bf16 sampling

Both start from DIR/warmup_adapter (the format warm-up's LoRA adapter, written by `bench_time_to_accuracy.py`) and
write DIR/<leg>_s<seed>.json: the held-out accuracy at step 0 and every `eval_every` steps against the seconds
of training before it (model loading and evaluation excluded), and every step's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from fractions import Fraction
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import yaml  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "smollm2_arithmetic.yaml"
DISTILL = ROOT / "configs" / "smollm2_distill.yaml"
MODEL = "smollm2-135m-instruct"


def recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def arithmetic_task():
    from rlvr_lightning.data.arithmetic import ArithmeticTask

    return ArithmeticTask(**recipe()["data"]["init_args"]["task"]["init_args"])


def is_correct(text: str, gold: str) -> bool:
    """The recipe's accuracy: the last boxed answer is a plain number equal to the gold one."""
    from rlvr_lightning.grading.answers import extract_answer, normalize_answer
    from rlvr_lightning.rewards.math import is_plain_number

    answer = extract_answer(text, ["boxed"])
    if not is_plain_number(answer):
        return False
    return Fraction(normalize_answer(answer).lstrip("+")) == Fraction(gold)


class HeldOutClock:
    """Training seconds (wall clock and the process's CPU time, evaluation excluded) and greedy held-out accuracy
    every `every` steps."""

    def __init__(self, out: Path, every: int, num: int, batch: int = 25, continued: bool = False) -> None:
        self.out, self.every, self.batch, self.continued = out, every, batch, continued
        self.problems = arithmetic_task().val_examples()[:num]
        self.points: list[dict] = []
        self.step_seconds: list[float] = []
        self.trained = self.trained_cpu = 0.0
        self.resumed = self.resumed_cpu = self.step_started = 0.0

    def start(self, model, tokenizer) -> None:
        if self.out.exists() and self.continued:  # a leg continued from its final checkpoint: its clock goes on
            recorded = json.loads(self.out.read_text())
            self.points, self.step_seconds = recorded["points"], recorded["step_seconds"]
            self.trained = self.points[-1]["train_seconds"]
            self.trained_cpu = self.points[-1].get("train_cpu_seconds", 0.0)
        else:
            self.evaluate(model, tokenizer, 0)
        self.resumed, self.resumed_cpu = time.perf_counter(), time.process_time()

    def step_begin(self) -> None:
        self.step_started = time.perf_counter()

    def step_end(self, model, tokenizer, step: int) -> None:
        now, now_cpu = time.perf_counter(), time.process_time()
        self.step_seconds.append(now - self.step_started)
        if step % self.every == 0:
            self.trained += now - self.resumed
            self.trained_cpu += now_cpu - self.resumed_cpu
            self.evaluate(model, tokenizer, step)
            self.resumed, self.resumed_cpu = time.perf_counter(), time.process_time()

    @torch.no_grad()
    def evaluate(self, model, tokenizer, step: int) -> None:
        started, was_training = time.perf_counter(), model.training
        model.eval()
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        right = 0
        for i in range(0, len(self.problems), self.batch):
            rows = self.problems[i : i + self.batch]
            texts = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
                )
                for row in rows
            ]
            encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            output = model.generate(**encoded, do_sample=False, max_new_tokens=32, pad_token_id=tokenizer.pad_token_id)
            responses = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
            right += sum(is_correct(text, row["answer"]) for text, row in zip(responses, rows, strict=True))
        tokenizer.padding_side = side
        model.train(was_training)
        accuracy = right / len(self.problems)
        point = {"step": step, "train_seconds": self.trained, "train_cpu_seconds": self.trained_cpu}
        self.points.append({**point, "accuracy": accuracy, "problems": len(self.problems)})
        print(
            f"step {step}: held-out accuracy {accuracy:.3f} after {self.trained:.0f} s of training "
            f"(evaluation {time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        self.out.write_text(json.dumps({"points": self.points, "step_seconds": self.step_seconds}, indent=1))


# ------------------------------------------------------------------ ours


class LightningClock(Callback):
    """`HeldOutClock` as a Lightning callback (named in the leg's YAML)."""

    def __init__(self, out: str, every: int, num: int, continued: bool = False) -> None:
        self.clock = HeldOutClock(Path(out), every, num, continued=continued)

    def on_train_start(self, trainer, pl_module) -> None:
        self.clock.start(pl_module.policy.model, pl_module.policy.tokenizer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.clock.step_begin()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = len(self.clock.step_seconds) + 1  # a continued leg goes on from its recorded steps
        self.clock.step_end(pl_module.policy.model, pl_module.policy.tokenizer, step)


def run_ours(args) -> None:
    """`rlvr fit` on the recipe, with the warm-up's weights, our evaluator instead of its validation loop, no
    rollout tables, and only the final checkpoint (TRL's leg saves none). `ours_bf16` samples from a bf16 copy
    of the weights, its mismatch corrected by `rollout_is: token_truncate`. The distillation legs run
    configs/smollm2_distill.yaml (the same recipe with a teacher) with `--teacher`: `distill` alone, `mixed`
    with GRPO's objective on the same rollouts (`distillation.rl_coef: 1`)."""
    name = f"{args.leg}_s{args.seed}"
    config = yaml.safe_load((DISTILL if args.leg in ("distill", "mixed") else RECIPE).read_text())
    trainer = config["trainer"]
    trainer.update(limit_train_batches=args.steps, limit_val_batches=0, max_time=None, logger=False)
    trainer.update(default_root_dir=str(args.out / name), enable_progress_bar=False)
    keep = [cb for cb in trainer["callbacks"] if "every_n_train_steps" not in (cb.get("init_args") or {})]
    keep = [cb for cb in keep if not cb["class_path"].endswith("RolloutTableLogger")]
    for cb in keep:
        if cb["class_path"].endswith("ModelCheckpoint"):
            cb["init_args"]["dirpath"] = str(args.out / name / "checkpoints")
    clock = {"out": str(args.out / f"{name}.json"), "every": args.eval_every, "num": args.num_eval}
    clock["continued"] = args.continue_run
    trainer["callbacks"] = keep + [{"class_path": "time_to_accuracy_legs.LightningClock", "init_args": clock}]
    model = config["model"]["init_args"]
    model["policy"]["init_args"]["checkpoint_path"] = str(args.warmup_ckpt)
    if args.leg in ("distill", "mixed"):
        model["teacher"]["init_args"]["checkpoint_path"] = str(args.teacher)
        model["distillation"]["rl_coef"] = 1.0 if args.leg == "mixed" else 0.0
    if args.leg == "ours_bf16":  # sampling from a bf16 copy of the weights, the mismatch corrected per token
        generation = {"class_path": "rlvr_lightning.generation.KVCacheGeneration", "init_args": {"dtype": "bfloat16"}}
        model["policy"]["init_args"]["policy"]["init_args"].setdefault("generation", {})["backend"] = generation
        model["rollout_is"] = {"mode": "token_truncate", "max": 2.0}
    config["seed_everything"] = args.seed
    path = args.out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    from rlvr_lightning.cli.app import main

    final = args.out / name / "checkpoints" / "final.ckpt"
    if args.continue_run:  # the final checkpoint ends epoch 0: the remaining steps are a second epoch
        if not final.exists():
            raise SystemExit(f"--continue_run: no {final} to continue from")
        done_steps = len(json.loads((args.out / f"{name}.json").read_text())["step_seconds"])
        config["trainer"].update(max_epochs=2, limit_train_batches=args.steps - done_steps)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    main(["fit", "--config", str(path), *(["--ckpt_path", str(final)] if args.continue_run else [])])


# ------------------------------------------------------------------ TRL


def run_trl(args) -> None:
    """TRL's `GRPOTrainer` with the recipe's hyper-parameters: the warm-up's LoRA adapter trained further, 4
    prompts x 8 samples of at most 32 tokens a step, the same problems in the same order, Dr. GRPO's centred
    advantages, token-mean PPO-clip loss, one update per rollout, no KL, AdamW 5e-5, gradient norm 1.0."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr_lightning.grading.answers import extract_answer, extract_boxed
    from rlvr_lightning.rewards.math import MathAccuracyReward, is_plain_number
    from rlvr_lightning.runtime.model_cache import resolve_model_path

    torch.manual_seed(args.seed)
    model_args = recipe()["model"]["init_args"]
    task, batch, group = arithmetic_task(), recipe()["data"]["init_args"]["batch_size"], model_args["group_size"]
    rows = [task.train_example(i) for i in range((args.steps + 1) * batch)]
    dataset = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": r["prompt"]}] for r in rows], "answer": [r["answer"] for r in rows]}
    )
    accuracy_reward = MathAccuracyReward(methods=["boxed"], numeric_only=True, workers=1, timeout_s=5.0)

    def accuracy(completions, answer, **kwargs):
        texts = [c[-1]["content"] for c in completions]
        texts = [t if is_plain_number(extract_answer(t, ["boxed"])) else None for t in texts]
        return accuracy_reward.verifier.score(texts, list(answer))[0]

    def boxed_format(completions, **kwargs):
        return [float(bool(extract_boxed(c[-1]["content"]))) for c in completions]

    clock = HeldOutClock(args.out / f"trl_s{args.seed}.json", args.eval_every, args.num_eval)

    class Clock(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, processing_class=None, **kwargs):
            clock.start(model, processing_class)

        def on_step_begin(self, a, state, control, **kwargs):
            clock.step_begin()

        def on_step_end(self, a, state, control, model=None, processing_class=None, **kwargs):
            clock.step_end(model, processing_class, state.global_step)

    optimizer = model_args["optimizer"]["init_args"]
    config = GRPOConfig(
        output_dir=str(args.out / f"trl_s{args.seed}"),
        per_device_train_batch_size=batch * group,
        gradient_accumulation_steps=1,
        num_generations=group,
        max_completion_length=model_args["sampling"]["max_new_tokens"],
        temperature=model_args["sampling"]["temperature"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the rollout (aggregation: token-mean)
        scale_rewards="none",  # Dr. GRPO: centred, not divided by the group's std (CenteredAdvantage)
        reward_weights=[1.0, 0.1],
        learning_rate=optimizer["lr"],
        weight_decay=optimizer["weight_decay"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        gradient_checkpointing=False,  # TRL defaults to True (memory for time); its fastest setting is off
        max_grad_norm=model_args["update"]["max_grad_norm"],
        max_steps=args.steps,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=args.seed,
        shuffle_dataset=False,
    )
    path = resolve_model_path(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model = PeftModel.from_pretrained(base, str(args.out / "warmup_adapter"), is_trainable=True)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[accuracy, boxed_format],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    try:
        trainer.train()
    finally:
        accuracy_reward.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("leg", choices=["ours", "ours_bf16", "trl", "distill", "mixed"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval_every", type=int, default=10)
    parser.add_argument("--num_eval", type=int, default=100)
    parser.add_argument("--teacher", type=Path, default=None, help="distill/mixed: the teacher's checkpoint")
    parser.add_argument(
        "--continue_run",
        action="store_true",
        help="our legs: continue the finished leg from its final checkpoint up to --steps, its clock going on",
    )
    args = parser.parse_args(argv)
    args.warmup_ckpt = args.out / "warmup" / "checkpoints" / "warmup" / "warmup.ckpt"
    torch.set_num_threads(1)
    (run_trl if args.leg == "trl" else run_ours)(args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
