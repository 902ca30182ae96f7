"""The GPU code paths on a CUDA device: the GSM8K recipe (tiny random Llama) trains with each documented GPU
setting, samples in the background on a side stream, resumes after Ctrl-C where the uninterrupted run is,
decodes with at most one host synchronisation per step, and scores the same with every attention kernel.
Skipped without a GPU; `scripts/gpu_check.sh` runs them (docs/scaling.md lists their CPU stand-ins)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

from rlvr_lightning.cli.app import entry_point, main
from rlvr_lightning.policies.hf_options import HFModelOptions

from ..gsm8k_tiny import WeightsAtStart, write_tiny_gsm8k_override

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "configs" / "gsm8k_qwen2.5_math_1.5b.yaml")
CALLBACKS = [f"--trainer.callbacks+=tests.gsm8k_tiny.{name}" for name in ("WeightsAtStart", "EvenTokenReward")]
SETTINGS = {  # docs/scaling.md's GPU settings as overrides of the recipe
    "bf16-mixed, checkpointing, sdpa": [],
    "32-true": ["--trainer.precision=32-true"],
    "eager, no checkpointing": [
        "--model.init_args.policy.init_args.model.attn_implementation=eager",
        "--model.init_args.policy.init_args.model.gradient_checkpointing=false",
    ],
}


@pytest.fixture(scope="module")
def override(tmp_path_factory) -> Path:
    # two problems in batches of 2: one batch an epoch
    return write_tiny_gsm8k_override(tmp_path_factory.mktemp("gsm8k_gpu"), accelerator="gpu", problems=2)


def moved_fraction(cli) -> float:
    start = next(cb for cb in cli.trainer.callbacks if isinstance(cb, WeightsAtStart))
    params = list(cli.model.policy.parameters())
    moved = sum(int((p.detach() != w.to(p.device)).sum()) for p, w in zip(params, start.weights, strict=True))
    return moved / sum(w.numel() for w in start.weights)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_recipe_trains_on_the_gpu(setting, override, in_tmp_dir):
    cli = main(["fit", "--config", RECIPE, "--config", str(override), *SETTINGS[setting], *CALLBACKS])
    assert cli.trainer.global_step == 2 and "val/accuracy" in cli.trainer.callback_metrics
    start = next(cb for cb in cli.trainer.callbacks if isinstance(cb, WeightsAtStart))
    assert start.devices == {"cuda"} and {p.dtype for p in cli.model.policy.parameters()} == {torch.float32}
    assert moved_fraction(cli) > 0.5


def test_background_rollouts_on_a_side_stream(override, in_tmp_dir):
    cli = main(
        ["fit", "--config", RECIPE, "--config", str(override), "--model.init_args.rollout_staleness=1"]
        + ["--trainer.max_epochs=3", *CALLBACKS]  # one batch an epoch
    )
    assert cli.trainer.global_step == 2 * 2 and moved_fraction(cli) > 0.5  # step 0 only samples
    assert cli.model.async_rollouts._stream is not None  # the background rollouts ran on the side stream


class StepRewards(WeightsAtStart):
    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        self.rewards = []

    def on_train_batch_end(self, trainer, *args):
        self.rewards.append(float(trainer.callback_metrics["train/reward_mean"]))


def test_resume_after_ctrl_c_continues_where_the_uninterrupted_run_is(override, in_tmp_dir):
    """Ctrl-C at the start of step 1 saves 2 steps; `--ckpt_path last` trains step 2 with the CUDA RNG state of
    the uninterrupted run: the same responses (rewards) and weights within float noise of CUDA's atomics."""
    command = ["fit", "--config", RECIPE, "--config", str(override), "--trainer.max_epochs=3"]  # a batch an epoch
    command += ["--model.init_args.optimizer.init_args.lr=0.01", "--trainer.limit_val_batches=0"]
    command += ["--trainer.callbacks+=tests.gsm8k_tiny.EvenTokenReward", f"--trainer.callbacks+={__name__}.StepRewards"]
    straight = main([*command, "--run_name=straight"])
    overlay = in_tmp_dir / "interrupt.yaml"  # Ctrl-C at the start of step 1, as tests/test_run_checkpoints.py
    overlay.write_text(
        "trainer:\n  callbacks+:\n    - class_path: tests.test_run_checkpoints.SendSigint\n      init_args: {step: 1}\n"
    )
    interrupt = ["--config", str(overlay)]
    assert entry_point([*command, "--run_name=resumed", *interrupt]) == 130
    resumed = main([*command, "--run_name=resumed", "--ckpt_path=last"])
    assert resumed.trainer.global_step == straight.trainer.global_step == 6
    recorders = [next(c for c in run.trainer.callbacks if isinstance(c, StepRewards)) for run in (straight, resumed)]
    rewards = [recorder.rewards for recorder in recorders]
    assert rewards[1] == rewards[0][2:], rewards
    for a, b in zip(straight.model.policy.parameters(), resumed.model.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_decoding_synchronises_the_host_at_most_once_per_step():
    """`torch.cuda.set_sync_debug_mode` warns at every synchronising call; the model's forward is left out
    (transformers' mask checks), as in tests/policies/test_host_syncs.py's CPU count. A generation also
    synchronises a few times outside its loop (on an H100: 3 beside 24 decoding steps), so the count is
    compared between two lengths: each further decoding step adds at most one."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr_lightning.demos.tiny_lm import tiny_llama_config
    from rlvr_lightning.generation.loop import generate, left_pad

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llama_config(vocab_size=64))).cuda().eval()
    forward = model.forward

    def forward_without_counting(*args, **kwargs):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return forward(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(1)

    model.forward = forward_without_counting
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10], [11, 12, 13]], pad_id=0)
    ids, mask = ids.cuda(), mask.cuda()

    def steps_and_syncs(max_new_tokens: int) -> tuple[int, int]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            try:
                out = generate(model, ids, mask, 4, max_new_tokens=max_new_tokens, eos_token_ids=[3], pad_token_id=0)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return out.steps, sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)

    (short_steps, short_syncs), (long_steps, long_syncs) = steps_and_syncs(8), steps_and_syncs(40)
    assert long_steps - short_steps >= 16, (short_steps, long_steps)
    assert short_syncs < long_syncs <= short_syncs + long_steps - short_steps, (short_syncs, long_syncs)  # counted


IMPLEMENTATIONS = ["eager", "sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_attention_kernel_scores_the_same(dtype, tmp_path):
    """One rollout (uneven prompts and responses) scored by the same weights with each kernel, in fp32 and
    under bf16 autocast (bf16-mixed training); flash-attention only under bf16, where it is installed."""
    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.generation.sampling_config import SamplingConfig
    from rlvr_lightning.policies.hf import HFPolicy

    tokenizer = str(save_tiny_tokenizer(tmp_path / "tok"))
    rollout, scores = None, {}
    for name in IMPLEMENTATIONS:
        if name == "flash_attention_2" and dtype == torch.float32:
            continue
        torch.manual_seed(0)
        policy = HFPolicy(
            model=HFModelOptions(
                config=tiny_llama_config(), tokenizer=tokenizer, attn_implementation=name, compile_layers="none"
            )
        )
        policy = policy.to("cuda").eval()
        if rollout is None:
            prompts = ["a", "The quick brown fox jumps over", "What is 2+3? The answer"]
            rollout = policy.sample({"prompt": prompts}, n=2, sampling=SamplingConfig(max_new_tokens=10))
            rollout.response_mask[0, 3:] = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            scores[name] = policy.token_log_probs(rollout)[0].float() * rollout.response_mask
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for name, value in scores.items():
        torch.testing.assert_close(value, scores["eager"], rtol=0, atol=tolerance, msg=name)
