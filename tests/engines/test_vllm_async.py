"""Asynchronous rollouts with the vLLM engine: it samples in the background thread while the update runs,
and weights reach it only between generations, from the training thread; a resumed run matches."""

from __future__ import annotations

import threading
import time

import torch
import yaml

from rlvr_lightning.generation.vllm_engine import VLLMGeneration

from .test_vllm_fit import _config, _train_rows


def _async_config(tmp_path, tokenizer_dir, name: str, steps: int):
    path = _config(tmp_path, tokenizer_dir, name, steps=steps)
    config = yaml.safe_load(path.read_text())
    config["model"]["init_args"]["rollout_staleness"] = 1
    del config["model"]["init_args"]["rollout_is"]  # the default of asynchronous rollouts: token_mask
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_engine_samples_beside_the_update_and_is_pushed_between(tokenizer_dir, tmp_path, monkeypatch):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from rlvr_lightning.cli.app import main
    from rlvr_lightning.modules.async_rollouts import AsyncRollouts

    monkeypatch.chdir(tmp_path)
    steps, launched_at, pushes, generations = [0], [-1], [], []
    push, generate, launch = VLLMGeneration._push_if_changed, VLLMGeneration.generate, AsyncRollouts.launch

    def recording_launch(self, batch, version):
        launched_at[0] = steps[0]
        return launch(self, batch, version)

    def recording_push(self, model):
        seconds = push(self, model)
        if seconds:  # a push happened: from which thread, and was a generation running?
            pushes.append(
                (threading.current_thread() is threading.main_thread(), bool(generations) and generations[-1] is None)
            )
        return seconds

    def recording_generate(self, *args, **kwargs):
        main_thread = threading.current_thread() is threading.main_thread()
        generations.append(None)  # running
        if not main_thread:  # beside an update: let its first optimizer step happen before the engine starts
            deadline = time.monotonic() + 60
            while steps[0] <= launched_at[0] and time.monotonic() < deadline:
                time.sleep(0.001)
        out = generate(self, *args, **kwargs)
        generations[-1] = (main_thread, steps[0] > launched_at[0])
        return out

    monkeypatch.setattr(AsyncRollouts, "launch", recording_launch)
    monkeypatch.setattr(VLLMGeneration, "_push_if_changed", recording_push)
    monkeypatch.setattr(VLLMGeneration, "generate", recording_generate)
    hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: steps.__setitem__(0, steps[0] + 1))
    try:
        full = main(["fit", "--config", str(_async_config(tmp_path, tokenizer_dir, "full", steps=4))])
    finally:
        hook.remove()

    assert full.trainer.global_step == 3 * 2  # step 0 samples only, then 3 steps x 2 epochs
    # step 0 samples batch 0 in the training thread; steps 1-3 launch batches 1-3 in the background, each of
    # which ran while the update of its step stepped the optimizer
    assert [main_thread for main_thread, _ in generations] == [True, False, False, False]
    assert all(overlapped for _, overlapped in generations[1:])
    # the first push, then one before each launch whose weights changed (steps 2 and 3): all from the training
    # thread, none while a generation ran
    assert pushes == [(True, False)] * 3
    engine = full.model.policy.generation
    assert engine.weight_pushes == 3 and engine.push_on_generate  # validation would push as usual between steps
    rows = _train_rows(tmp_path, "full")
    assert [float(row["train/async/policy_lag"]) for row in rows] == [0.0, 2.0, 2.0]
    assert all(float(row["train/mismatch/abs_diff_max"]) > 0 for row in rows[1:])  # one update stale

    # a new run (new engine) from the checkpoint after step 2 (it holds batch 2's rollout): the same end
    (after_two,) = (tmp_path / "ckpt_full").glob("*rollout_step=2*.ckpt")
    resumed = main(
        [
            "fit",
            "--config",
            str(_async_config(tmp_path, tokenizer_dir, "resumed", steps=4)),
            "--ckpt_path",
            str(after_two),
        ]
    )
    assert _train_rows(tmp_path, "resumed")[-1]["train/reward_mean"] == rows[-1]["train/reward_mean"]
    final, expected = resumed.model.policy.model.state_dict(), full.model.policy.model.state_dict()
    assert all(torch.equal(final[name], expected[name]) for name in expected)
