"""Loading a Hugging Face causal LM and its tokenizer for `HFPolicy`.

Where the model comes from (exactly one of):

* `model_name_or_path`: a local Hugging Face directory, a hub id (from the local HF cache when
  offline), or an alias from `rlvr_lightning.runtime.model_cache` (e.g. `smollm2-135m-instruct`);
* `gguf_file`: a GGUF file, de-quantised by transformers (needs the `gguf` package): a path, or a
  file name inside the directory `model_name_or_path`;
* `config`: random weights from a config (a dict with `model_type`, or a path to a config.json or
  directory), for tests and experiments.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from rlvr_lightning.core.float32_head import use_float32_head
from rlvr_lightning.policies.memory_estimate import check_fits_in_memory, transformer_parameters
from rlvr_lightning.runtime.model_cache import missing_model_message, resolve_model_path

_warned_no_pad: set[str] = set()


def model_source(
    model_name_or_path: str | None, gguf_file: str | None, config: dict[str, Any] | str | None
) -> tuple[str | None, str | None]:
    """The directory (or hub id) to load from and the GGUF file name in it, if any."""
    if config is not None:
        if gguf_file is not None:
            raise ValueError("HFPolicy: give either model.config (random weights) or model.gguf_file, not both")
        return (resolve_model_path(model_name_or_path) if model_name_or_path else None), None
    if gguf_file is not None:
        if model_name_or_path is None:
            path = Path(gguf_file).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"GGUF file {gguf_file!r} does not exist ({path.resolve()})")
            return str(path.resolve().parent), path.name
        directory = resolve_model_path(model_name_or_path)
        path = Path(directory) / gguf_file
        if Path(directory).is_dir() and not path.is_file():
            raise FileNotFoundError(f"GGUF file {gguf_file!r} does not exist in {directory} ({path.resolve()})")
        return directory, gguf_file
    if model_name_or_path is None:
        raise ValueError("HFPolicy needs model.name_or_path, model.gguf_file or model.config")
    return resolve_model_path(model_name_or_path), None


def check_gguf(directory: str, gguf_name: str, error: Exception) -> None:
    """Turn a failed GGUF load into a clear error when the architecture is the reason."""
    path = Path(directory) / gguf_name
    try:
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        field = GGUFReader(str(path)).fields.get("general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode() if field is not None else None
    except ImportError:
        raise ImportError(f"Loading the GGUF file {path} needs the `gguf` package: pip install gguf") from error
    except Exception as read_error:  # not even a readable GGUF file
        raise ValueError(f"Could not read the GGUF file {path}: {read_error}") from error
    name = (architecture or "").replace("-", "_")
    # transformers renames a few architectures (qwen2moe -> qwen2_moe, t5encoder -> t5, ...)
    candidates = {name, name.replace("moe", "_moe"), "t5" if name.startswith("t5") else name}
    if not candidates & {a.replace("-", "_") for a in GGUF_SUPPORTED_ARCHITECTURES}:
        import transformers

        raise ValueError(
            f"GGUF file {path} has architecture {architecture!r}, which transformers {transformers.__version__} "
            f"cannot load (supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}). "
            "Use a Hugging Face checkpoint of this model instead."
        ) from error


def load_tokenizer(source: str, gguf_name: str | None, trust_remote_code: bool = False) -> Any:
    """The tokenizer, with the EOS token as pad when it has no pad token (pad positions are always masked)."""
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, source, gguf_name, {"trust_remote_code": trust_remote_code})
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"The tokenizer of {source!r} has neither a pad token nor an EOS token to pad with")
        if source not in _warned_no_pad:
            _warned_no_pad.add(source)
            warnings.warn(
                f"The tokenizer of {source!r} has no pad token; using its EOS token {tokenizer.eos_token!r} "
                "as pad (pad positions are always masked)",
                stacklevel=3,
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(source: str, gguf_name: str | None, kwargs: dict[str, Any]) -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained`, with clear errors for missing models and GGUF files."""
    from transformers import AutoModelForCausalLM

    model = _from_pretrained(AutoModelForCausalLM, source, gguf_name, kwargs)
    if gguf_name is not None and hasattr(model.config, "quantization_config"):
        # the weights are de-quantised: train and save them as a plain model
        del model.config.quantization_config
        model.hf_quantizer = None
    return model


def _from_pretrained(auto_class: Any, source: str, gguf_name: str | None, kwargs: dict[str, Any]) -> Any:
    """`auto_class.from_pretrained`, failing with the model's name (and the GGUF architecture) when it cannot load."""
    if gguf_name is not None:
        kwargs = dict(kwargs, gguf_file=gguf_name)
    try:
        return auto_class.from_pretrained(source, **kwargs)
    except Exception as error:
        if gguf_name is not None:
            check_gguf(source, gguf_name, error)
        if not Path(source).exists():
            raise FileNotFoundError(missing_model_message(source) + f" ({type(error).__name__}: {error})") from error
        raise


def model_from_config(config: dict[str, Any] | str, tokenizer: Any, kwargs: dict[str, Any]) -> nn.Module:
    """Random weights from a config dict or file; vocabulary size and special tokens default to the tokenizer's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(config, (str, os.PathLike)):
        path = Path(config).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"Model config {str(config)!r} does not exist ({path.resolve()})")
        hf_config = AutoConfig.from_pretrained(str(path), trust_remote_code=kwargs.get("trust_remote_code", False))
    else:
        values = dict(config)
        if "model_type" not in values:
            raise ValueError("HFPolicy(model.config={...}) needs a 'model_type' (e.g. 'llama')")
        values.setdefault("vocab_size", len(tokenizer))
        for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
            token_id = getattr(tokenizer, name, None)
            if token_id is not None:
                values.setdefault(name, token_id)
        hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
    if getattr(hf_config, "vocab_size", len(tokenizer)) < len(tokenizer):
        raise ValueError(f"config vocab_size {hf_config.vocab_size} < tokenizer size {len(tokenizer)}")
    kwargs = {k: v for k, v in kwargs.items() if k != "trust_remote_code"}
    num_parameters = transformer_parameters(hf_config)
    if num_parameters is not None:  # before anything is allocated
        dtype = kwargs.get("dtype")
        check_fits_in_memory("model.config", "the model it describes", num_parameters, getattr(dtype, "itemsize", 4))
    return AutoModelForCausalLM.from_config(hf_config, **kwargs)


def disable_dropout(model: nn.Module) -> None:
    """Dropout off everywhere (as TRL's `disable_dropout`): sampling and scoring see the same network."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):  # attention layers copy it from the config
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    non_reentrant = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=non_reentrant)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)


#: the forward hooks that make the input embeddings' output require grad: transformers' `enable_input_require_grads`
#: (added by its checkpointing) and PEFT's fallback (`get_peft_model` over a checkpointed model)
INPUT_GRAD_HOOKS = ("make_inputs_require_grads", "make_inputs_require_grad")


def drop_input_grad_hooks(model: nn.Module) -> None:
    """Remove the hooks of `INPUT_GRAD_HOOKS` from `model`'s modules where its checkpointing is non-reentrant (ours,
    `enable_gradient_checkpointing`; a model of transformers' pre-4.35 checkpointing format ignores those arguments and
    keeps them). Only reentrant checkpointing needs an input that requires grad to reach the weights, and the hook's
    `requires_grad_` is an operation dynamo cannot trace: it kept the compiled decoding step off checkpointed models."""
    setter = getattr(model, "_set_gradient_checkpointing", None)
    if setter is not None and "value" in inspect.signature(setter).parameters:
        return
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__name__", None) in INPUT_GRAD_HOOKS:
                del module._forward_hooks[key]


PEFT_MISSING = (
    "LoRA (lora.r > 0) needs the peft package, which is not installed: pip install 'rlvr-lightning[hf]' "
    "(or: pip install peft)"
)


def peft_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("peft") is not None


def add_lora(
    model: nn.Module, r: int, alpha: float, dropout: float, target_modules: list[str] | str | None
) -> tuple[nn.Module, Any]:
    """The model wrapped with a trainable LoRA adapter ("default"), and the adapter's config."""
    from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, task_type="CAUSAL_LM"
    )
    try:
        return get_peft_model(model, lora_config), lora_config
    except ValueError as error:
        if "target modules" not in str(error).lower():
            raise
        raise ValueError(_missing_target_message(model, target_modules, error)) from error


def _missing_target_message(model: nn.Module, target_modules: list[str] | str | None, error: ValueError) -> str:
    """peft's refusal of `target_modules` as a message that names the option, the first name no module has and
    the names of the model's linear layers."""
    if isinstance(target_modules, list):
        leaves = {name.rpartition(".")[2] for name, _ in model.named_modules()}
        missing = [name for name in target_modules if name not in leaves]
        if missing:
            linear = sorted(
                {name.rpartition(".")[2] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
            )
            return f"lora.target_modules: no module of the model is named {missing[0]!r}; choose from {linear!r}"
    return f"lora.target_modules={target_modules!r}: {error}"


def eos_token_ids(tokenizer: Any, model: nn.Module) -> list[int]:
    """The tokenizer's EOS token and every EOS the generation config names (chat models often have several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Sequence):
        ids.update(int(i) for i in eos)
    return sorted(ids)


def float32_output_layer(model: nn.Module) -> None:
    """`model.lm_head_fp32`: the model's output layer computes its logits in float32 (`core/float32_head.py`); a
    clear error where it is not a plain linear layer (a LoRA adapter on it, as TRL refuses one)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if hasattr(head, "base_layer"):
        raise ValueError(
            "model.lm_head_fp32 cannot compute a LoRA adapter's output layer in float32: leave the LM head "
            f"({type(head).__name__}) out of lora.target_modules, or set model.lm_head_fp32: false"
        )
    if type(head) is not nn.Linear:
        raise ValueError(f"model.lm_head_fp32 needs a plain nn.Linear output layer; this model's is {type(head)!r}")
    use_float32_head(head, tied=embeddings is not None and embeddings.weight is head.weight)
