"""A config naming a hub model while the hub does not answer fails at once with the policy's message
(no five retries per file, no traceback), and a config naming none never probes the hub."""

import os
import subprocess
import sys
import time

import huggingface_hub.constants

from rlvr_lightning.runtime import hub

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused at once
CONFIG = """
trainer:
  max_epochs: 1
  limit_train_batches: 1
  logger: false
  enable_checkpointing: false
  callbacks:
    - class_path: rlvr_lightning.rewards.ContainsReward
      init_args: {key: answer}
model:
  class_path: rlvr_lightning.modules.RLVRModule
  init_args:
    policy:
      class_path: rlvr_lightning.policies.HFPolicy
      init_args: {model: {name_or_path: no-such-org/no-such-model}}
data:
  class_path: rlvr_lightning.data.RLVRDataModule
  init_args:
    task:
      class_path: rlvr_lightning.data.InlineTask
      init_args: {examples: [{prompt: "What is 1 + 1?", answer: "2"}]}
"""


def test_hub_ids_are_the_remote_names_of_models_tokenizers_and_datasets(tmp_path):
    local = tmp_path / "org" / "model"
    local.mkdir(parents=True)
    config = {
        "model": {
            "init_args": {
                "policy": {"init_args": {"model": {"name_or_path": "Qwen/Qwen2.5-Math-1.5B", "tokenizer": str(local)}}}
            }
        },
        "data": {"init_args": {"task": {"init_args": {"dataset": "openai/gsm8k"}}}},
        "trainer": {"callbacks": [{"init_args": {"dirpath": "runs/x"}}]},  # a path, not a model: not looked at
    }
    assert hub.hub_ids(config) == ["Qwen/Qwen2.5-Math-1.5B", "openai/gsm8k"]
    assert hub.hub_ids({"model": {"init_args": {"model": {"name_or_path": "smollm2-135m-instruct"}}}}) == []  # an alias


def test_unreachable_hub_switches_to_offline_mode(monkeypatch, capsys):
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", CLOSED)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert not hub.go_offline_if_unreachable(
        {"model": {"name_or_path": "smollm2-135m-instruct"}}
    )  # nothing remote: no probe
    assert os.environ.get("HF_HUB_OFFLINE") is None
    assert hub.go_offline_if_unreachable({"model": {"name_or_path": "no-such-org/no-such-model"}})
    assert os.environ["HF_HUB_OFFLINE"] == "1" and huggingface_hub.constants.HF_HUB_OFFLINE is True
    assert "does not answer: using the local cache only for no-such-org/no-such-model" in capsys.readouterr().out


def test_rlvr_fit_fails_fast_with_the_policy_message(tmp_path):
    config = tmp_path / "remote.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in hub.OFFLINE_VARIABLES}
    env.update(HF_ENDPOINT=CLOSED, HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith("error: Model 'no-such-org/no-such-model' was not found"), done.stderr[
        -3000:
    ]
    assert "at model.init_args.policy" in done.stderr
    assert "Retry" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 120
