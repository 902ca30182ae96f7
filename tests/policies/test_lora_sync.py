"""`lora_sync` without vLLM: the adapter's tensors under PEFT's saved names, their bytes, the PEFT directory an
engine loads, which weights each push sends (`WeightPush`), the fallbacks and the option's error."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr_lightning.policies import ServerGeneration, VLLMGeneration
from rlvr_lightning.policies.hf_options import LoRAOptions
from rlvr_lightning.serving.lora_sync import (
    WeightPush,
    adapter_tensors,
    adapter_unsupported,
    engine_lora_rank,
    tensor_bytes,
    write_adapter,
)
from rlvr_lightning.serving.vllm_weights import named_weights


@pytest.fixture
def lora_policy(make_policy):
    return make_policy(lora=LoRAOptions(r=4))


def test_adapter_tensors_carry_pefts_saved_names_and_leave_the_reference_adapter_out(lora_policy):
    from peft import get_peft_model_state_dict

    model = lora_policy.model
    model.add_adapter("reference", lora_policy._lora_config)  # the KL reference's adapter is never sent
    expected = get_peft_model_state_dict(model, adapter_name="default")
    ours = adapter_tensors(model)
    assert sorted(ours) == sorted(expected)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in ours
    assert all(torch.equal(ours[name], expected[name]) for name in ours)
    assert {t.dtype for t in adapter_tensors(model, torch.bfloat16).values()} == {torch.bfloat16}


def test_adapter_bytes_by_hand(lora_policy):
    # the tiny Llama: hidden 64, intermediate 128, 4 heads of 16, 2 key-value heads (32); per layer, sum of
    # in + out over q 64+64, k 64+32, v 64+32, o 64+64, gate 64+128, up 64+128, down 128+64 = 1024;
    # r = 4: A is r x in, B is out x r, so 4 * 1024 parameters per layer, 2 layers, 4 bytes each
    assert tensor_bytes(adapter_tensors(lora_policy.model).values()) == 4 * 1024 * 2 * 4
    assert tensor_bytes([torch.zeros(3, 5, dtype=torch.bfloat16)]) == 30


def test_the_written_directory_is_a_peft_adapter(lora_policy, tmp_path):
    from peft import LoraConfig
    from safetensors.torch import load_file

    tensors = adapter_tensors(lora_policy.model)
    sent = write_adapter(str(tmp_path), tensors, lora_policy._lora_config)
    assert sent == tensor_bytes(tensors.values())
    loaded = load_file(tmp_path / "adapter_model.safetensors")
    assert sorted(loaded) == sorted(tensors) and all(torch.equal(loaded[n], tensors[n]) for n in tensors)
    config = LoraConfig.from_pretrained(str(tmp_path))
    assert (config.r, config.lora_alpha) == (4, 16.0)
    assert isinstance(json.loads((tmp_path / "adapter_config.json").read_text())["target_modules"], (list, str))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


def test_engine_ranks_are_the_ones_vllm_accepts():
    assert [engine_lora_rank(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]


class Engine:
    """The two ways a backend pushes, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def weights(self, weights) -> None:
        self.calls.append(("weights", [name for name, _ in weights]))

    def adapter(self) -> None:
        self.calls.append(("adapter", []))


def _push(weights: WeightPush, policy, engine: Engine, directory, fresh: bool = False) -> int:
    return weights.push(policy.model, torch.float32, engine.weights, engine.adapter, str(directory), fresh)


def test_the_adapter_is_sent_alone_once_the_base_is_there(lora_policy, tmp_path):
    push, engine = WeightPush("VLLMGeneration", "adapter"), Engine()
    assert push.decide(lora_policy.model, lambda rank: None) and push.rank == 8
    adapter_bytes = tensor_bytes(adapter_tensors(lora_policy.model).values())
    base = [(n, t) for n, t in named_weights(lora_policy.model, merge_lora=False)]
    assert _push(push, lora_policy, engine, tmp_path, fresh=True) == tensor_bytes(t for _, t in base) + adapter_bytes
    assert engine.calls == [("weights", [n for n, _ in base]), ("adapter", [])]
    assert not any("lora" in name for name in engine.calls[0][1])

    engine.calls.clear()
    with torch.no_grad():  # an update moves the adapter only
        next(p for n, p in lora_policy.model.named_parameters() if "lora_B" in n).add_(0.1)
    assert _push(push, lora_policy, engine, tmp_path) == adapter_bytes
    assert engine.calls == [("adapter", [])]

    engine.calls.clear()  # a base weight changed in place (a checkpoint loaded), or an engine that lost its weights
    lora_policy.model.load_state_dict(lora_policy.model.state_dict())
    _push(push, lora_policy, engine, tmp_path)
    _push(push, lora_policy, engine, tmp_path, fresh=True)
    assert [kind for kind, _ in engine.calls] == ["weights", "adapter", "weights", "adapter"]


def test_merged_sends_every_merged_weight(lora_policy, tmp_path):
    push, engine = WeightPush("VLLMGeneration", "merged"), Engine()
    assert not push.decide(lora_policy.model, lambda rank: None)
    sent = _push(push, lora_policy, engine, tmp_path)
    merged = list(named_weights(lora_policy.model, torch.float32))
    assert sent == tensor_bytes(t for _, t in merged) and engine.calls == [("weights", [n for n, _ in merged])]


def test_an_engine_without_lora_falls_back_with_the_reason(lora_policy, make_policy, caplog):
    unsupported = lambda rank: f"the engine holds no rank {rank}"  # noqa: E731
    with pytest.warns(UserWarning) as caught:
        assert not WeightPush("VLLMGeneration", "adapter").decide(lora_policy.model, unsupported)
    assert str(caught[0].message) == (
        "VLLMGeneration lora_sync=adapter: the engine holds no rank 8; pushing the merged weights instead"
    )
    with caplog.at_level("INFO", logger="rlvr_lightning.serving.lora_sync"):
        assert not WeightPush("ServerGeneration", "auto").decide(lora_policy.model, unsupported)  # auto: no warning
    assert "ServerGeneration lora_sync=auto: the engine holds no rank 8" in caplog.text
    with pytest.warns(UserWarning, match=r"lora_sync=adapter: the policy has no LoRA adapter \(lora_r = 0\)"):
        assert not WeightPush("VLLMGeneration", "adapter").decide(make_policy().model, lambda rank: None)
    assert not WeightPush("VLLMGeneration", "auto").decide(make_policy().model, lambda rank: None)


def test_adapters_vllm_cannot_serve_are_named(lora_policy):
    from peft import LoraConfig

    assert adapter_unsupported(lora_policy._lora_config) is None
    assert "DoRA" in adapter_unsupported(LoraConfig(r=4, use_dora=True))
    assert "trained in full" in adapter_unsupported(LoraConfig(r=4, modules_to_save=["lm_head"]))


@pytest.mark.parametrize("backend", [VLLMGeneration, lambda **kw: ServerGeneration(servers=["localhost:1"], **kw)])
def test_an_invalid_lora_sync_names_the_option_the_value_and_the_choices(backend):
    with pytest.raises(ValueError) as error:
        backend(lora_sync="full")
    assert str(error.value).endswith("lora_sync='full' is not valid; choose one of ['merged', 'adapter', 'auto']")
