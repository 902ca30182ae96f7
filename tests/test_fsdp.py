"""FSDP2 (`strategy: fsdp2`) on 2 CPU processes (gloo): every module trains as under DDP, a killed run
resumes bitwise from its sharded checkpoint, and `rlvr export` turns checkpoints into Hugging Face
directories that `from_pretrained` loads with the same log-probs.

The runs (tiny random Llama, tests/fsdp_support.py) are started once per module: one 2-process job runs
the DDP/FSDP2 pairs in a row; the resume test starts 3 `rlvr fit` jobs through Lightning's launcher.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
from fsdp_support import resume_config, write_config  # noqa: E402

from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer  # noqa: E402
from rlvr_lightning.policies.hf_options import HFModelOptions, LoRAOptions  # noqa: E402

CASES = ["rl", "rl_lora", "sft", "ei", "ppo"]
K, STEPS = 4, 8  # the resumed run is killed at the start of rollout step K (checkpoint of step K just written)


def _env(**extra) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
    }
    path = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    return {**env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(processes: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for process, log in zip(processes, logs, strict=True):
            code = process.wait(timeout=max(deadline - time.monotonic(), 1))
            assert code == 0, f"{log.name} exited with {code}:\n" + log.read_text()[-4000:]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    return str(save_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tokenizer_dir) -> Path:
    """One 2-process job (ranks started as torchrun would) running every case under DDP and under FSDP2."""
    out = tmp_path_factory.mktemp("fsdp_vs_ddp")
    runs = [f"{case}:{strategy}" for case in CASES for strategy in ("ddp", "fsdp2")]
    runs += ["ppo_whole:ddp", "lora_ckpt:fsdp2_full_ckpt", "validate_first:fsdp2"]
    runs += ["rl_packed:ddp", "rl_packed:fsdp2", "ppo_packed:fsdp2"]
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", NODE_RANK="0")
    processes, logs = [], []
    for rank in (1, 0):
        log = out / f"rank{rank}.log"
        processes.append(
            subprocess.Popen(
                [sys.executable, str(TESTS / "fsdp_support.py"), str(out), tokenizer_dir, *runs],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                cwd=out,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=open(log, "w"),
            )
        )
        logs.append(log)
    _wait(processes, logs, timeout=480)
    return out


@pytest.mark.parametrize("case", CASES)
def test_fsdp2_ends_where_ddp_ends(pairs, case):
    ddp, fsdp = (torch.load(pairs / f"{case}-{strategy}.pt") for strategy in ("ddp", "fsdp2"))
    assert ddp["global_step"] == fsdp["global_step"] >= 3  # optimizer updates
    assert ddp["state"].keys() == fsdp["state"].keys()
    moved = max((ddp["state"][k] - ddp["initial"][k]).abs().max().item() for k in ddp["state"])
    assert moved > 1e-3  # the runs trained: a 1e-5 agreement is not agreement of untouched weights
    for key, value in ddp["state"].items():
        assert torch.allclose(value, fsdp["state"][key], rtol=0, atol=1e-5), (
            key,
            (value - fsdp["state"][key]).abs().max(),
        )
    for name, value in ddp["metrics"].items():
        # a value that moved less than value_clip is counted as clipped when V_old + (V - V_old) rounds above V
        if name.startswith("train/") and "generation" not in name and name != "train/critic/clip_frac":
            assert fsdp["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    if case == "rl":  # the KL term was on, against a sharded reference refreshed (mixup 0.5) every step
        assert ddp["metrics"]["train/kl"] > 0
        assert any(
            not torch.equal(fsdp["state"][k], fsdp["initial"][k]) for k in fsdp["state"] if k.startswith("reference.")
        )
    if case == "ei":  # ranks kept different numbers of responses (padded to the same number of passes)
        assert ddp["metrics"]["train/kept"] != int(ddp["metrics"]["train/kept"])
    if case == "ppo":  # the critic and its value head trained after the warm-up step, the policy only after it
        for prefix in ("critic.", "value_head.", "policy."):
            assert any(
                not torch.equal(fsdp["state"][k], fsdp["initial"][k]) for k in fsdp["state"] if k.startswith(prefix)
            )
        assert torch.equal(fsdp["state"]["critic.model.lm_head.weight"], fsdp["initial"]["critic.model.lm_head.weight"])


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize("case", CASES)
def test_ranks_end_with_the_same_weights(pairs, case, strategy):
    """Each rank trains on its own prompts; unsynchronised gradients (a replicated critic under FSDP2) drift apart."""
    ranks = [torch.load(pairs / f"{case}-{strategy}.rank{r}.pt") for r in (0, 1)]
    for key, value in ranks[0].items():
        assert torch.equal(value, ranks[1][key]), key


@pytest.mark.parametrize("case", CASES)
def test_ddp_all_reduces_gradients_once_per_optimizer_step(pairs, case):
    """rl, ppo and ei accumulate 2 micro-batches per optimizer step: the first backward keeps its gradients local."""
    steps = torch.load(pairs / f"{case}-ddp.pt")["global_step"]
    for rank in (0, 1):
        assert json.loads((pairs / f"{case}-ddp.syncs{rank}.json").read_text()) == steps


def test_ppo_warms_up_under_ddp_and_micro_batches_change_nothing(pairs):
    """PPO's warm-up leaves the policy without gradients and the separate critic never uses its LM head: DDP must
    find unused parameters. Skipping the all-reduce of all micro-batches but the last is exact accumulation."""
    micro, whole = (torch.load(pairs / f"{case}-ddp.pt") for case in ("ppo", "ppo_whole"))
    assert micro["global_step"] == whole["global_step"] == 4
    for key, value in micro["state"].items():
        assert torch.allclose(value, whole["state"][key], rtol=0, atol=1e-6), key


@pytest.mark.parametrize(
    ("padded", "packed"),
    [("rl-ddp", "rl_packed-ddp"), ("rl-ddp", "rl_packed-fsdp2"), ("ppo-fsdp2", "ppo_packed-fsdp2")],
)
def test_packed_micro_batches_end_where_row_micro_batches_end(pairs, padded, packed):
    """`update.micro_batch_tokens`: micro-batches of at most 64 tokens, as many on both ranks, scored packed, give
    the row micro-batches' training; DDP still all-reduces once per optimizer step; the ranks stay identical."""
    rows, tokens = torch.load(pairs / f"{padded}.pt"), torch.load(pairs / f"{packed}.pt")
    assert rows["global_step"] == tokens["global_step"] >= 3
    for key, value in rows["state"].items():
        assert torch.allclose(value, tokens["state"][key], rtol=0, atol=1e-5), key
    assert tokens["metrics"]["train/loss"] == pytest.approx(rows["metrics"]["train/loss"], rel=1e-4, abs=1e-6)
    ranks = [torch.load(pairs / f"{packed}.rank{r}.pt") for r in (0, 1)]
    assert all(torch.equal(value, ranks[1][key]) for key, value in ranks[0].items())
    if packed.endswith("ddp"):
        for rank in (0, 1):
            assert json.loads((pairs / f"{packed}.syncs{rank}.json").read_text()) == tokens["global_step"]


def test_validating_before_the_first_step_in_inference_mode(pairs):
    """`rlvr validate`, then a fit, with Lightning's evaluation in inference mode as on GPUs (`evaluation_as_on_gpus`):
    FSDP2's first unshard under inference mode made inference tensors of the buffers later unshards reuse."""
    run = torch.load(pairs / "validate_first-fsdp2.pt")
    assert run["global_step"] == 1 and "val/reward_mean" in run["metrics"]


def test_sharded_sampling_gathers_once_and_samples_what_the_full_model_samples(pairs):
    """Ranks decode different numbers of tokens: per-forward all-gathers would pair up wrongly across ranks."""
    results = [json.loads((pairs / f"rl-fsdp2.sampling{r}.json").read_text()) for r in (0, 1)]
    assert [r["width"] for r in results] != [results[0]["width"]] * 2  # ranks sampled different lengths
    assert all(r["equal"] and r["second_call_rows"] == 1 for r in results)


def test_fsdp2_shards_every_parameter_across_the_ranks(pairs):
    for case in CASES:
        ranks = [json.loads((pairs / f"{case}-fsdp2.rank{r}.json").read_text()) for r in (0, 1)]
        ddp = json.loads((pairs / f"{case}-ddp.rank0.json").read_text())
        assert ddp["dtensor_params"] == 0 and ddp["local_numel"] == ddp["full_numel"]
        for rank in ranks:
            assert rank["dtensor_params"] > 0 and rank["plain_params"] == []  # policy, reference, critic, value head
            assert rank["local_numel"] <= rank["full_numel"] / 2 + 64 * 4  # dim-0 shards (padding at most a few rows)
        assert sum(rank["local_numel"] for rank in ranks) == ranks[0]["full_numel"]


# ----------------------------------------------------------------------------- kill and resume


def _fit(config: Path, out: Path, name: str) -> tuple[subprocess.Popen, Path]:
    log = out / f"{name}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "rlvr_lightning.cli", "fit", "--config", str(config)],
        env=_env(),
        cwd=out,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )
    return process, log


def _logged(out: Path, name: str, key: str = "train/reward_mean") -> dict[int, str]:
    values = {}
    for path in sorted((out / "logs" / name).rglob("metrics.csv")):
        with open(path) as f:
            values.update({int(row["step"]): row[key] for row in csv.DictReader(f) if row.get(key)})
    return values


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, tokenizer_dir) -> Path:
    """A run SIGKILLed (both ranks) at the start of step K, resumed with --ckpt_path last, and the same run
    uninterrupted."""
    out = tmp_path_factory.mktemp("fsdp_resume")
    killed_config = write_config(
        resume_config("killed", str(out), tokenizer_dir, STEPS, wait_at=K), out / "killed.yaml"
    )
    full_config = write_config(resume_config("full", str(out), tokenizer_dir, STEPS), out / "full.yaml")
    killed, killed_log = _fit(killed_config, out, "killed")
    full, full_log = _fit(full_config, out, "full")
    deadline = time.monotonic() + 300
    while not (out / "killed.waiting").exists():
        if killed.poll() is not None or time.monotonic() > deadline:
            os.killpg(full.pid, signal.SIGKILL)
            raise AssertionError("the run did not reach the kill point:\n" + killed_log.read_text()[-4000:])
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)  # kill -9, rank 0 and the rank 1 it launched
    killed.wait(timeout=60)
    _wait([full], [full_log], timeout=300)

    resumed_config = resume_config("resumed", str(out), tokenizer_dir, STEPS)
    checkpoints = next(
        cb for cb in resumed_config["trainer"]["callbacks"] if cb["class_path"].endswith("RolloutCheckpoint")
    )
    checkpoints["init_args"]["dirpath"] = f"{out}/ckpt_killed"  # --ckpt_path last looks there
    resumed_config["ckpt_path"] = "last"
    process, log = _fit(write_config(resumed_config, out / "resumed.yaml"), out, "resumed")
    _wait([process], [log], timeout=300)
    return out


def test_killed_fsdp2_run_resumes_bitwise(resumed):
    last = resumed / "ckpt_killed" / "last.ckpt"
    assert (
        last.is_dir() and (last / "meta.pt").is_file() and len(list(last.glob("*.distcp"))) == 2
    )  # one shard per rank
    full, after = torch.load(resumed / "full.pt"), torch.load(resumed / "resumed.pt")
    assert full["global_step"] == after["global_step"] == STEPS * 2 * 2  # 2 epochs x 2 mini-batches per rollout step
    assert any(k.startswith("reference.") for k in full["state"])
    for key, value in full["state"].items():
        assert torch.equal(value, after["state"][key]), key  # bitwise, policy and reference
    full_log, killed_log, resumed_log = (_logged(resumed, name) for name in ("full", "killed", "resumed"))
    assert (
        sorted(full_log) == list(range(STEPS)) and killed_log and set(killed_log) <= set(range(K))
    )  # CSV flushed lazily
    assert sorted(resumed_log) == list(range(K, STEPS))
    assert resumed_log == {step: full_log[step] for step in resumed_log}  # every logged reward, as written
    assert killed_log == {step: full_log[step] for step in killed_log}
    leftovers = [p.name for p in (resumed / "ckpt_killed").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # staged checkpoint directories were all moved into place


# ----------------------------------------------------------------------------- export


def _log_probs(model, rollout) -> torch.Tensor:
    """Response log-probs `[N, T]` from one plain forward of a transformers model (no rlvr_lightning code)."""
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)
    mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_ids)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = rollout.response_ids.shape[1]
    picked = (
        torch.log_softmax(logits[:, -width - 1 : -1], dim=-1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    )
    return picked * rollout.response_mask


def _trained_policy(tokenizer_dir: str, state: dict, **options):
    """An unsharded HFPolicy holding the `policy.*` weights of a run's full state dict."""
    from fsdp_support import TINY_LLAMA

    from rlvr_lightning.policies.hf import HFPolicy

    policy = HFPolicy(model=HFModelOptions(config=TINY_LLAMA, tokenizer=tokenizer_dir), **options)
    policy.load_state_dict({k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")})
    return policy.eval()


@pytest.mark.parametrize("source", ["sharded", "file_lora"])
def test_export_gives_a_hugging_face_directory_with_the_same_log_probs(resumed, pairs, tokenizer_dir, tmp_path, source):
    from transformers import AutoModelForCausalLM

    from rlvr_lightning.cli.app import main
    from rlvr_lightning.generation.sampling_config import SamplingConfig

    if source == "sharded":  # the directory of shards of the uninterrupted run's last step
        config, ckpt, run = resumed / "full.yaml", resumed / "ckpt_full" / "last.ckpt", torch.load(resumed / "full.pt")
        assert ckpt.is_dir()
        trained = _trained_policy(tokenizer_dir, run["state"])
    else:  # a .ckpt file gathered on rank 0 by FSDP2Strategy(save_distributed_checkpoint=false), LoRA merged on export
        config = pairs / "lora_ckpt-fsdp2_full_ckpt.rank0.yaml"
        ckpt, run = (
            pairs / "ckpt_lora_ckpt-fsdp2_full_ckpt" / "final.ckpt",
            torch.load(pairs / "lora_ckpt-fsdp2_full_ckpt.pt"),
        )
        assert ckpt.is_file()
        trained = _trained_policy(tokenizer_dir, run["state"], lora=LoRAOptions(r=4, alpha=8.0))
        assert any("lora_B" in k and v.abs().max() > 0 for k, v in run["state"].items())  # the adapter trained
    output = tmp_path / "hf"
    main(["export", "--config", str(config), "--ckpt_path", str(ckpt), "--output_dir", str(output)])

    exported = AutoModelForCausalLM.from_pretrained(output).eval()
    assert not any("lora" in name for name, _ in exported.named_parameters())
    torch.manual_seed(0)
    with torch.no_grad():
        rollout = trained.sample({"prompt": ["What is 2+3?", "The quick brown"]}, 3, SamplingConfig(max_new_tokens=8))
        expected, _ = trained.token_log_probs(rollout)
        actual = _log_probs(exported, rollout)
    assert rollout.response_mask.sum() > 6
    assert torch.allclose(actual, expected, rtol=0, atol=1e-5), (actual - expected).abs().max()
    if source == "sharded":  # no LoRA: the very weights the run ended with
        for name, value in exported.state_dict().items():
            assert torch.equal(value, run["state"][f"policy.model.{name}"]), name


def test_export_refuses_what_it_cannot_write(resumed, tmp_path):
    from rlvr_lightning.cli.app import main

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        main(
            [
                "export",
                "--config",
                str(resumed / "full.yaml"),
                "--ckpt_path",
                str(resumed / "ckpt_full" / "last.ckpt"),
                "--output_dir",
                str(busy),
            ]
        )
    assert (busy / "keep.txt").read_text() == "mine"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main(
            [
                "export",
                "--config",
                str(resumed / "full.yaml"),
                "--ckpt_path",
                str(tmp_path / "nope.ckpt"),
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )
    with pytest.raises(ValueError, match="not a sharded checkpoint"):
        main(
            [
                "export",
                "--config",
                str(resumed / "full.yaml"),
                "--ckpt_path",
                str(busy),
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )


def test_a_later_stage_starts_from_a_sharded_checkpoint(resumed, tokenizer_dir):
    from fsdp_support import TINY_LLAMA

    from rlvr_lightning.modules.sft import policy_from_checkpoint
    from rlvr_lightning.policies.hf import HFPolicy

    policy = HFPolicy(model=HFModelOptions(config=TINY_LLAMA, tokenizer=tokenizer_dir))
    policy_from_checkpoint(policy, str(resumed / "ckpt_full" / "last.ckpt"))
    final = torch.load(resumed / "full.pt")["state"]
    for name, value in policy.state_dict().items():
        assert torch.equal(value, final[f"policy.{name}"]), name
