"""`rlvr serve`: the vLLM server command it replaces itself with (vLLM itself runs in tests/engines)."""

from __future__ import annotations

import pytest
import yaml

from rlvr_lightning.cli.app import entry_point
from rlvr_lightning.serving import serve


def test_rlvr_serve_execs_vllms_server_with_the_worker_extension(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    policy = {"class_path": "HFPolicy", "init_args": {"model": {"name_or_path": str(tmp_path)}}}
    config.write_text(yaml.safe_dump({"model": {"init_args": {"policy": policy}}}))
    calls = []
    monkeypatch.setattr(serve.os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    entry_point(["serve", "--config", str(config), "--port", "8011", "--", "--max-model-len", "512"])
    ((path, argv, env),) = calls
    assert argv[0] == path and argv[1:5] == [
        "-W",
        "ignore::DeprecationWarning",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    joined = " ".join(argv)
    assert f"--model {tmp_path} --host 127.0.0.1 --port 8011 --dtype float32" in joined
    assert "--worker-extension-cls rlvr_lightning.serving.server_worker.WeightReceiver" in joined
    assert "--logprobs-mode processed_logprobs --generation-config vllm --load-format dummy" in joined
    assert argv[-2:] == ["--max-model-len", "512"]  # after `--`: passed to vLLM as they are
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # the /collective_rpc endpoint the weight pushes use


def test_a_config_without_a_model_path_says_what_to_pass(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": {"init_args": {}}}))
    with pytest.raises(SystemExit, match="names no model.init_args.policy.init_args.model.name_or_path; pass --model"):
        serve.main(["--config", str(config)])


def test_max_lora_rank_serves_an_adapter_the_trainer_can_register(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(serve.os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    serve.main(["--model", str(tmp_path), "--max-lora-rank", "8"])
    ((_, argv, env),) = calls
    assert "--enable-lora --max-lora-rank 8 --max-loras 1" in " ".join(argv)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"  # opens /v1/load_lora_adapter
    with pytest.raises(SystemExit):
        serve.main(["--model", str(tmp_path), "--max-lora-rank", "4"])  # not a rank vLLM accepts
    assert "argument --max-lora-rank: invalid choice: 4 (choose from 1, 8, 16" in capsys.readouterr().err
