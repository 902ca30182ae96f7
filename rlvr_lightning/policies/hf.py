"""`HFPolicy`: a transformers causal language model as a `Policy`.

Where the model comes from (exactly one of):

* `model_name_or_path`: a local Hugging Face directory, a hub id (from the local HF cache when
  offline), or an alias from `rlvr_lightning.policies.model_cache` (e.g. `smollm2-135m-instruct`,
  fetched once with `rlvr-models fetch smollm2-135m-instruct`);
* `gguf_file`: a GGUF file, de-quantised by transformers (needs the `gguf` package). Either a path to
  the file, or a file name inside the directory `model_name_or_path`;
* `config`: random weights from a config (a dict with `model_type`, or a path to a config.json /
  directory), for tests and experiments. The tokenizer then comes from `tokenizer_name_or_path`.

Prompts (`batch["prompt"]` items) are rendered by `prompt_template`:

* `"chat"`: the tokenizer's chat template, with the generation prompt appended. A prompt is a user
  message (str) or a list of `{"role", "content"}` messages; `system_prompt`, if set, is prepended
  unless the messages already start with a system message;
* `"raw"`: the prompt string as is (the tokenizer adds its special tokens, e.g. BOS);
* any other string: a template in which `{prompt}` (and `{system}`, if present) are replaced.

A prompt may also be a list of token ids, used as is.

Tokenizers without a pad token use the EOS token as pad (with one warning). Pad positions are always
masked, so this changes nothing but the filler ids.

`sample` uses a hand-written batched loop (`rlvr_lightning.policies.generation.generate`): left padding,
a `DynamicCache`, one prefill per distinct prompt, finished rows dropped from the batch. It honours
`SamplingConfig.do_sample` (False: greedy argmax), never samples EOS before `min_new_tokens` tokens, and
records `last_generation_stats` (response length mean/min/max, truncated fraction, tokens/s, ...).

`token_log_probs` runs each distinct prompt of the rows through the model once and the responses on
top of its key/value cache (`share_prompt_prefix`; the rows of a group share their prompt), which
saves most of the prompt's share of the forward and backward passes.

Dropout is switched off (`disable_dropout`, as in TRL) so that sampling and scoring see the same
network, and the model is put in train mode (transformers only checkpoints activations in train mode).

With LoRA (`lora_r > 0`) the base weights are frozen and the KL reference is the base model with the
adapter disabled: `create_reference` returns a parameter-free marker and no second copy is made.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlvr_lightning.policies.base import Policy, PromptBatch, SamplingConfig
from rlvr_lightning.policies.generation import (
    StopStringChecker,
    entropy_from_logits,
    generate,
    left_pad,
    position_ids_from_mask,
    token_log_probs_from_logits,
)
from rlvr_lightning.policies.model_cache import missing_model_message, resolve_model_path
from rlvr_lightning.rollout import Rollout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REFERENCE_ADAPTER = "reference"

_warned_no_pad: set[str] = set()


def _disable_dropout(model: nn.Module) -> None:
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


class AdapterReference(nn.Module):
    """The KL reference of a LoRA policy: its own base model, adapter disabled (holds no weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.has_adapter_copy = False  # set once `update_reference` copied the adapter into "reference"

    def extra_repr(self) -> str:
        return "base model with the adapter disabled" if not self.has_adapter_copy else "reference adapter"


class HFPolicy(Policy):
    """A Hugging Face causal LM policy (see the module docstring for the options)."""

    def __init__(
        self,
        model_name_or_path: str | None = None,
        gguf_file: str | None = None,
        config: dict[str, Any] | str | None = None,
        tokenizer_name_or_path: str | None = None,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        attn_implementation: str | None = "sdpa",
        gradient_checkpointing: bool = False,
        lora_r: int = 0,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        lora_target_modules: list[str] | str | None = "all-linear",
        prompt_template: str = "chat",
        system_prompt: str | None = None,
        keep_sampling_log_probs: bool = False,
        min_new_tokens: int = 0,
        disable_dropout: bool = True,
        share_prompt_prefix: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if prompt_template not in ("chat", "raw") and "{prompt}" not in prompt_template:
            raise ValueError(f"prompt_template must be 'chat', 'raw' or contain '{{prompt}}', got {prompt_template!r}")
        if system_prompt is not None and (
            prompt_template == "raw" or (prompt_template != "chat" and "{system}" not in prompt_template)
        ):
            raise ValueError("system_prompt needs prompt_template='chat' or a template containing '{system}'")
        if lora_r < 0:
            raise ValueError(f"lora_r must be >= 0 (0 = no LoRA), got {lora_r}")
        self.model_name_or_path = model_name_or_path
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.keep_sampling_log_probs = keep_sampling_log_probs
        if min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {min_new_tokens}")
        self.min_new_tokens = min_new_tokens
        self.share_prompt_prefix = share_prompt_prefix
        self.gradient_checkpointing = gradient_checkpointing
        self.lora_r = lora_r
        self.torch_dtype = DTYPES[dtype]
        self.last_generation_stats: dict[str, float] = {}

        load_kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        model_source, gguf_name = self._model_source(model_name_or_path, gguf_file, config)
        if tokenizer_name_or_path is not None:
            tokenizer_source, tokenizer_gguf = resolve_model_path(tokenizer_name_or_path), None
        elif model_source is not None:
            tokenizer_source, tokenizer_gguf = model_source, gguf_name
        else:
            raise ValueError("HFPolicy(config=...) needs tokenizer_name_or_path (or model_name_or_path) for the tokenizer")
        self.tokenizer = self._load_tokenizer(tokenizer_source, tokenizer_gguf, load_kwargs)

        model_kwargs = dict(load_kwargs, dtype=self.torch_dtype)
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        if config is not None:
            model = self._model_from_config(config, model_kwargs)
        else:
            model = self._load_model(model_source, gguf_name, model_kwargs)
        if disable_dropout:
            _disable_dropout(model)
        # from_pretrained returns the model in eval mode; transformers runs gradient checkpointing only in train mode
        model.train()
        if gradient_checkpointing:
            non_reentrant = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=non_reentrant)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=non_reentrant)
        if lora_r > 0:
            from peft import LoraConfig, get_peft_model

            lora_config = LoraConfig(
                r=lora_r,
                lora_alpha=lora_alpha,
                lora_dropout=lora_dropout,
                target_modules=lora_target_modules,
                task_type="CAUSAL_LM",
            )
            self._lora_config = lora_config
            model = get_peft_model(model, lora_config)
        self.model = model

        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.eos_token_ids = self._eos_ids()
        if not self.eos_token_ids:
            warnings.warn("HFPolicy: neither the tokenizer nor the generation config names an EOS token", stacklevel=2)
        text_config = self.hf_config.get_text_config(decoder=True) if hasattr(self.hf_config, "get_text_config") else self.hf_config
        self.max_context: int | None = getattr(text_config, "max_position_embeddings", None)

    # ------------------------------------------------------------------ loading

    @staticmethod
    def _model_source(
        model_name_or_path: str | None, gguf_file: str | None, config: dict[str, Any] | str | None
    ) -> tuple[str | None, str | None]:
        if config is not None:
            if gguf_file is not None:
                raise ValueError("HFPolicy: give either config= (random weights) or gguf_file=, not both")
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
            raise ValueError("HFPolicy needs model_name_or_path, gguf_file or config")
        return resolve_model_path(model_name_or_path), None

    @staticmethod
    def _check_gguf(directory: str, gguf_name: str, error: Exception) -> None:
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

    def _load_tokenizer(self, source: str, gguf_name: str | None, load_kwargs: dict[str, Any]) -> Any:
        from transformers import AutoTokenizer

        kwargs = dict(load_kwargs)
        if gguf_name is not None:
            kwargs["gguf_file"] = gguf_name
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        except Exception as error:
            if gguf_name is not None:
                self._check_gguf(source, gguf_name, error)
            if not Path(source).exists():
                raise FileNotFoundError(missing_model_message(source) + f" ({type(error).__name__}: {error})") from error
            raise
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

    def _load_model(self, source: str, gguf_name: str | None, kwargs: dict[str, Any]) -> nn.Module:
        from transformers import AutoModelForCausalLM

        if gguf_name is not None:
            kwargs = dict(kwargs, gguf_file=gguf_name)
        try:
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        except Exception as error:
            if gguf_name is not None:
                self._check_gguf(source, gguf_name, error)
            if not Path(source).exists():
                raise FileNotFoundError(missing_model_message(source) + f" ({type(error).__name__}: {error})") from error
            raise
        if gguf_name is not None and hasattr(model.config, "quantization_config"):
            # the weights are de-quantised: train and save them as a plain model
            del model.config.quantization_config
            model.hf_quantizer = None
        return model

    def _model_from_config(self, config: dict[str, Any] | str, kwargs: dict[str, Any]) -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        if isinstance(config, (str, os.PathLike)):
            path = Path(config).expanduser()
            if not path.exists():
                raise FileNotFoundError(f"Model config {str(config)!r} does not exist ({path.resolve()})")
            hf_config = AutoConfig.from_pretrained(str(path), trust_remote_code=kwargs["trust_remote_code"])
        else:
            values = dict(config)
            if "model_type" not in values:
                raise ValueError("HFPolicy(config={...}) needs a 'model_type' (e.g. 'llama')")
            values.setdefault("vocab_size", len(self.tokenizer))
            for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
                token_id = getattr(self.tokenizer, name, None)
                if token_id is not None:
                    values.setdefault(name, token_id)
            hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
        if getattr(hf_config, "vocab_size", len(self.tokenizer)) < len(self.tokenizer):
            raise ValueError(f"config vocab_size {hf_config.vocab_size} < tokenizer size {len(self.tokenizer)}")
        kwargs = {k: v for k, v in kwargs.items() if k != "trust_remote_code"}
        return AutoModelForCausalLM.from_config(hf_config, **kwargs)

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        generation_config = getattr(self.base_model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, Sequence):
            ids.update(int(i) for i in eos)
        return sorted(ids)

    # ------------------------------------------------------------------ properties

    @property
    def base_model(self) -> nn.Module:
        """The transformers model without the LoRA wrapper."""
        if self.lora_r > 0:
            return self.model.get_base_model()
        return self.model

    @property
    def hf_config(self) -> Any:
        return self.base_model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ prompts

    def render_prompt(self, prompt: Any) -> str:
        """The text the model sees for one prompt of a batch."""
        if self.prompt_template == "chat":
            if isinstance(prompt, str):
                messages = [{"role": "user", "content": prompt}]
            elif isinstance(prompt, Sequence) and all(isinstance(m, dict) for m in prompt):
                messages = [dict(m) for m in prompt]
            else:
                raise TypeError(f"a chat prompt is a string or a list of message dicts, got {type(prompt).__name__}")
            if self.system_prompt is not None and (not messages or messages[0].get("role") != "system"):
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            if getattr(self.tokenizer, "chat_template", None) is None:
                raise ValueError(
                    "prompt_template='chat' but the tokenizer has no chat template; "
                    "use prompt_template='raw' or a template string containing '{prompt}'"
                )
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(prompt, str):
            raise TypeError(f"prompt_template={self.prompt_template!r} needs string prompts, got {type(prompt).__name__}")
        if self.prompt_template == "raw":
            return prompt
        text = self.prompt_template.replace("{prompt}", prompt)
        if "{system}" in text:
            text = text.replace("{system}", self.system_prompt or "")
        return text

    def encode_prompts(self, prompts: Sequence[Any]) -> tuple[list[list[int]], list[str]]:
        """Token ids and rendered text of each prompt."""
        ids: list[list[int] | None] = [None] * len(prompts)
        texts: list[str | None] = [None] * len(prompts)
        to_encode: list[int] = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
                ids[i] = list(prompt)
                texts[i] = self.tokenizer.decode(ids[i])
            else:
                texts[i] = self.render_prompt(prompt)
                to_encode.append(i)
        if to_encode:
            # chat templates write their special tokens themselves; raw text gets the tokenizer's (BOS, ...)
            add_special = self.prompt_template != "chat"
            encoded = self.tokenizer([texts[i] for i in to_encode], add_special_tokens=add_special)["input_ids"]
            for i, row in zip(to_encode, encoded, strict=True):
                ids[i] = list(row)
        for i, row in enumerate(ids):
            if not row:
                raise ValueError(f"prompt {i} of the batch is empty after tokenization")
        return ids, texts  # type: ignore[return-value]

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def sample(self, batch: PromptBatch, n: int, sampling: SamplingConfig) -> Rollout:
        prompts = list(batch["prompt"])
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            raise ValueError("sample() got an empty batch")
        metadata = list(batch.get("metadata") or [{} for _ in prompts])
        if len(metadata) != len(prompts):
            raise ValueError(f"batch has {len(prompts)} prompts but {len(metadata)} metadata entries")
        prompt_token_ids, prompt_texts = self.encode_prompts(prompts)
        if self.max_context is not None:
            for i, row in enumerate(prompt_token_ids):
                if len(row) + sampling.max_new_tokens > self.max_context:
                    raise ValueError(
                        f"prompt {i} of the batch is {len(row)} tokens long; with max_new_tokens="
                        f"{sampling.max_new_tokens} that exceeds the model's context of {self.max_context} tokens "
                        f"(max_position_embeddings): at most {self.max_context - sampling.max_new_tokens} prompt tokens fit"
                    )
        device = self.device
        prompt_ids, prompt_mask = left_pad(prompt_token_ids, self.pad_token_id)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)

        stop = StopStringChecker(
            sampling.stop_strings, lambda rows: self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        )
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling; gradient checkpointing would also turn the cache off
        try:
            out = generate(
                self.model,
                prompt_ids,
                prompt_mask,
                n,
                max_new_tokens=sampling.max_new_tokens,
                eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                temperature=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                stop=stop,
                do_sample=sampling.do_sample,
                min_new_tokens=max(self.min_new_tokens, int(getattr(sampling, "min_new_tokens", 0) or 0)),
            )
        finally:
            self.model.train(was_training)

        lengths = out.response_mask.sum(-1)
        response_token_lists = [
            row[: int(length)] for row, length in zip(out.response_ids.tolist(), lengths.tolist(), strict=True)
        ]
        response_text = self.tokenizer.batch_decode(response_token_lists, skip_special_tokens=True)
        if stop:
            response_text = [stop.cut(text)[0] if hit else text for text, hit in zip(response_text, out.stopped_by_string.tolist(), strict=True)]

        num_rows = len(prompts) * n
        generated = float(lengths.sum().item())
        self.last_generation_stats = {
            "response_length/mean": float(lengths.mean().item()),
            "response_length/min": float(lengths.min().item()),
            "response_length/max": float(lengths.max().item()),
            "prompt_length/mean": float(prompt_mask.sum(-1).float().mean().item()),
            "truncated_fraction": float(out.truncated.float().mean().item()),
            "stop_string_fraction": float(out.stopped_by_string.float().mean().item()),
            "generation_seconds": out.seconds,
            "prefill_seconds": out.prefill_seconds,
            "generation_steps": float(out.steps),
            "tokens_per_second": generated / max(out.seconds, 1e-9),
            "num_rows": float(num_rows),
        }
        return Rollout(
            prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
            prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
            response_ids=out.response_ids,
            response_mask=out.response_mask,
            group_index=torch.arange(len(prompts), device=device).repeat_interleave(n),
            group_size=n,
            truncated=out.truncated,
            prompt_text=[text for text in prompt_texts for _ in range(n)],
            response_text=response_text,
            metadata=[dict(m) for m in metadata for _ in range(n)],
            old_log_probs=out.log_probs if self.keep_sampling_log_probs else None,
        )

    # ------------------------------------------------------------------ scoring

    def _forward_response_logits(self, rollout: Rollout) -> tuple[Tensor, int]:
        """Logits `[N, t, V]` of the positions predicting `response_ids[:, :t]` (t = last masked column + 1)."""
        prompt_mask = rollout.prompt_mask
        used_prompt = prompt_mask.bool().any(0).nonzero()
        if used_prompt.numel() == 0:
            raise ValueError("token_log_probs: every prompt in the rows is empty")
        first = int(used_prompt[0].item())
        used_response = rollout.response_mask.bool().any(0).nonzero()
        t = int(used_response[-1].item()) + 1 if used_response.numel() else 1
        t = min(t, rollout.response_ids.shape[1])
        prompt_ids, prompt_mask = rollout.prompt_ids[:, first:], prompt_mask[:, first:]
        if self.share_prompt_prefix and self._prefix_sharing_supported():
            shared = self._shared_prefix_logits(prompt_ids, prompt_mask, rollout.response_ids[:, : t - 1])
            if shared is not None:
                return shared, t
        ids = torch.cat([prompt_ids, rollout.response_ids[:, : t - 1]], dim=1)
        mask = torch.cat(
            [prompt_mask, torch.ones_like(rollout.response_ids[:, : t - 1], dtype=prompt_mask.dtype)], dim=1
        )
        kwargs: dict[str, Any] = {}
        if self._logits_to_keep_supported():
            kwargs["logits_to_keep"] = t
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False, **kwargs
        )
        return out.logits[:, -t:, :], t

    def _shared_prefix_logits(self, prompt_ids: Tensor, prompt_mask: Tensor, responses: Tensor) -> Tensor | None:
        """The logits of `_forward_response_logits`, with each distinct prompt run through the model once.

        The rows of a group share their prompt: its key/value cache is computed once (with gradients)
        and gathered for every row, then the responses run on top of it. Same numbers as the joint
        forward, about `len(prompt) * (rows - distinct prompts)` fewer token positions. None when the
        rows do not share prompts (nothing to gain) or the model's cache is not a plain KV cache.
        """
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        num_rows = prompt_ids.shape[0]
        distinct, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask], dim=1), dim=0, return_inverse=True)
        if distinct.shape[0] * 4 > num_rows * 3:  # under 25% of the prompt tokens saved: one joint forward
            return None
        width = prompt_ids.shape[1]
        unique_ids, unique_mask = distinct[:, :width], distinct[:, width:]
        unique_positions = position_ids_from_mask(unique_mask)
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep_supported() else {}
        cache = DynamicCache(config=self.hf_config)
        out = self.model(
            input_ids=unique_ids,
            attention_mask=unique_mask,
            position_ids=unique_positions,
            past_key_values=cache,
            use_cache=True,
            **kwargs,
        )
        cache = out.past_key_values
        if not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
            self._prefix_sharing = False  # sliding windows, linear attention, ...: always the joint forward
            return None
        first_logits = out.logits[:, -1:, :][inverse]
        del out
        if responses.shape[1] == 0:
            return first_logits
        cache.batch_select_indices(inverse)
        mask = torch.cat([prompt_mask, torch.ones_like(responses, dtype=prompt_mask.dtype)], dim=1)
        start = unique_positions[:, -1][inverse] + 1
        positions = start.unsqueeze(1) + torch.arange(responses.shape[1], device=responses.device)
        out = self.model(
            input_ids=responses, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        return torch.cat([first_logits, out.logits], dim=1)

    def _prefix_sharing_supported(self) -> bool:
        supported = getattr(self, "_prefix_sharing", None)
        if supported is None:
            text_config = self.hf_config.get_text_config(decoder=True) if hasattr(self.hf_config, "get_text_config") else self.hf_config
            layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
            supported = (
                not self.gradient_checkpointing  # transformers turns the cache off in train mode then
                and not getattr(text_config, "sliding_window", None)
                and all(kind == "full_attention" for kind in layer_types)
            )
            self._prefix_sharing = supported
        return supported

    def _logits_to_keep_supported(self) -> bool:
        supported = getattr(self, "_logits_to_keep", None)
        if supported is None:
            import inspect

            supported = "logits_to_keep" in inspect.signature(self.base_model.forward).parameters
            self._logits_to_keep = supported
        return supported

    def token_log_probs(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        num_rows, width = rollout.response_ids.shape
        if width == 0:
            empty = rollout.response_mask.new_zeros((num_rows, 0))
            return empty, (empty if with_entropy else None)
        logits, t = self._forward_response_logits(rollout)
        mask = rollout.response_mask[:, :t] > 0
        log_probs = token_log_probs_from_logits(logits, rollout.response_ids[:, :t], temperature)
        log_probs = F.pad(torch.where(mask, log_probs, 0.0), (0, width - t))
        entropy = None
        if with_entropy:
            entropy = entropy_from_logits(logits, temperature)
            entropy = F.pad(torch.where(mask, entropy, 0.0), (0, width - t))
        return log_probs, entropy

    # ------------------------------------------------------------------ reference

    def create_reference(self) -> nn.Module:
        if self.lora_r > 0:
            return AdapterReference()
        memo = {id(self.tokenizer): self.tokenizer}  # share the tokenizer, copy the weights
        reference = copy.deepcopy(self, memo)
        reference.requires_grad_(False)
        reference.eval()
        return reference

    @torch.no_grad()
    def update_reference(self, reference: nn.Module, alpha: float = 1.0) -> None:
        if not isinstance(reference, AdapterReference):
            super().update_reference(reference, alpha)
            return
        if alpha != 1.0:
            raise NotImplementedError(
                "With LoRA the reference is an adapter; a partial update (alpha < 1) of a low-rank product "
                "is not a low-rank product. Use alpha=1 (reset the reference to the current policy)."
            )
        peft_model = self.model
        if REFERENCE_ADAPTER not in peft_model.peft_config:
            peft_model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(self._lora_config))
        params = dict(peft_model.named_parameters())
        for name, param in params.items():
            if f".{REFERENCE_ADAPTER}." in name:
                source = params[name.replace(f".{REFERENCE_ADAPTER}.", ".default.")]
                param.copy_(source.detach())
                param.requires_grad_(False)
        reference.has_adapter_copy = True

    def reference_log_probs(self, reference: nn.Module, rollout: Rollout, temperature: float) -> Tensor:
        if not isinstance(reference, AdapterReference):
            return super().reference_log_probs(reference, rollout, temperature)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if reference.has_adapter_copy:
                    self.model.set_adapter(REFERENCE_ADAPTER)
                    try:
                        log_probs, _ = self.token_log_probs(rollout, temperature=temperature)
                    finally:
                        self.model.set_adapter("default")  # also makes "default" the trainable one again
                        self._freeze_reference_adapter()
                else:
                    with self.model.disable_adapter():
                        log_probs, _ = self.token_log_probs(rollout, temperature=temperature)
        finally:
            self.model.train(was_training)
        return log_probs

    def _freeze_reference_adapter(self) -> None:
        for name, param in self.model.named_parameters():
            if f".{REFERENCE_ADAPTER}." in name:
                param.requires_grad_(False)

    # ------------------------------------------------------------------ export

    def save_pretrained(self, directory: str | os.PathLike, merge_lora: bool = True) -> None:
        """Save the model (LoRA merged into a copy of the base weights by default) and the tokenizer."""
        model = self.model
        if self.lora_r > 0 and merge_lora:
            model = copy.deepcopy(self.model)
            if REFERENCE_ADAPTER in model.peft_config:
                model.delete_adapter(REFERENCE_ADAPTER)
            model = model.merge_and_unload()
        model.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))
