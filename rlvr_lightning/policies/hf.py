"""`HFPolicy`: a transformers causal language model as a `Policy` (its options: `rlvr fit --model.policy.help
HFPolicy`); the model comes from `model_name_or_path`, `gguf_file` or `config` (`policies/hf_loading.py`).

Prompts (`batch["prompt"]` items) are rendered by `prompt_template`:

* `"chat"`: the tokenizer's chat template, with the generation prompt appended. A prompt is a user
  message (str) or a list of `{"role", "content"}` messages; `system_prompt`, if set, is prepended
  unless the messages already start with a system message;
* `"raw"`: the prompt string as is (the tokenizer adds its special tokens, e.g. BOS);
* any other string: a template in which `{prompt}` (and `{system}`, if present) are replaced.

A prompt may also be a list of token ids, used as is (`policies/prompt_encoding.py`).

Three seams, one file each:

* loading (`hf_loading.py`): model, tokenizer, dropout off, gradient checkpointing, LoRA;
* generation (`generation/backend.py`): `generation` picks the backend that samples, our KV-cache
  loop (by default eager on a CPU, over a static cache on a CUDA device) or a vLLM engine. `sample` records
  the sampling log-probs in `rollout.sampling_log_probs` and `last_generation_stats`;
* scoring (`hf_scoring.py`): `token_log_probs`, each distinct prompt run once with the responses on
  top of its cache.

Multi-turn responses: `tools` (`multiturn/tool_use.py`: the policy calls tools mid-response, observations
are appended) and `thinking_budget` (`multiturn/thinking_budget.py`: a forced `</think>` after so many
thinking tokens) generate in segments above the backend (`multiturn/segmented_generation.py`); inserted
tokens have `response_mask` 0 and are recorded in `rollout.response_source`.

Dropout is switched off (`disable_dropout`, as in TRL) so that sampling and scoring see the same
network, and the model is put in train mode (transformers only checkpoints activations in train mode).
`lean_activations` (on by default) gives Llama-family RMSNorm and SwiGLU layers forwards that keep fewer
tensors for the backward pass, recomputing cheap ones (`policies/lean_layers.py`), and applies the output
layer with `linear_token_log_probs`, whose backward has no logit-sized temporaries (same forward values).

With LoRA (`lora_r > 0`) the base weights are frozen and the KL reference is the base model with the
adapter disabled: `create_reference` returns a parameter-free marker and no second copy is made
(`policies/lora_reference.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import warnings
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.backend import GenerationBackend
from rlvr_lightning.generation.device_default import DeviceDefaultGeneration
from rlvr_lightning.generation.loop import KVCacheGeneration, left_pad
from rlvr_lightning.generation.output import generation_stats
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.segmented_generation import decode_responses, generate_segments
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.multiturn.tool_use import ToolUse
from rlvr_lightning.policies import hf_loading, prompt_encoding
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.policies.hf_scoring import HFScoring
from rlvr_lightning.policies.lean_layers import apply_lean_layers
from rlvr_lightning.policies.lora_reference import (
    AdapterReference,
    copy_adapter_to_reference,
    merged_copy,
    scoring_as_reference,
)
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.devices import compute_device
from rlvr_lightning.runtime.model_cache import resolve_model_path
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, OneOf, Range

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def warn_renormalised_log_probs(backend: str) -> None:
    warnings.warn(
        f"{backend}: with top_k/top_p the engine's log-probs are renormalised over the kept tokens, so the "
        "rollouts record no sampling log-probs: no train/mismatch metrics and no rollout_is weights. Sample with "
        "top_p: 1 and top_k: 0, or with KVCacheGeneration, which records the unfiltered log-probs",
        stacklevel=3,
    )


@documented_options
class HFPolicy(HFScoring, Policy):
    """A Hugging Face causal LM policy (see the module docstring)."""

    def __init__(
        self,
        model_name_or_path: Annotated[
            str | None,
            Option("a local directory, hub id or `rlvr-models` alias of the model (null: gguf_file or config)."),
        ] = None,
        gguf_file: Annotated[
            str | None, Option("a GGUF file to load the model from (`policies/hf_loading.py`).")
        ] = None,
        config: Annotated[
            dict[str, Any] | str | None,
            Option("a transformers config (mapping or path): a model of that shape with random weights."),
        ] = None,
        tokenizer_name_or_path: Annotated[
            str | None, Option("the tokenizer's directory or hub id (null: the model's).")
        ] = None,
        dtype: Annotated[
            Literal["float32", "bfloat16", "float16"], Option("the dtype of the weights.", OneOf(tuple(DTYPES)))
        ] = "float32",
        attn_implementation: Annotated[
            str | None, Option("transformers' attention implementation (null: transformers' default).")
        ] = "sdpa",
        gradient_checkpointing: Annotated[
            bool, Option("recompute activations in the backward pass instead of keeping them.")
        ] = False,
        lean_activations: Annotated[
            bool,
            Option(
                "RMSNorm and SwiGLU layers keep fewer activations for the backward pass (fewer bytes per token; "
                "same forward values, gradients equal to float rounding)."
            ),
        ] = True,
        lora_r: Annotated[int, Option("the LoRA rank (0: no LoRA, the full model trains).", NON_NEGATIVE_INT)] = 0,
        lora_alpha: Annotated[
            float, Option("LoRA's scale numerator (scale alpha / r).", Range(0, low_open=True))
        ] = 16.0,
        lora_dropout: Annotated[
            float, Option("dropout on the LoRA adapter's input.", Range(0, 1, high_open=True))
        ] = 0.0,
        lora_target_modules: Annotated[
            list[str] | str | None, Option("the modules LoRA adapts (peft's target_modules; all-linear: every linear).")
        ] = "all-linear",
        prompt_template: Annotated[
            str,
            Option(
                "chat (the tokenizer's chat template) | raw (the prompt as is) | a template with {prompt} "
                "(and {system})."
            ),
        ] = "chat",
        system_prompt: Annotated[
            str | None, Option("a system message put before each chat prompt (null: none).")
        ] = None,
        generation: Annotated[
            GenerationBackend | None,
            Option(
                "the backend that samples (default `DeviceDefaultGeneration`: our loop, over a static cache with a "
                "graph-held step on a CUDA device (`StaticCacheGeneration`), eager elsewhere (`KVCacheGeneration`); "
                "or `VLLMGeneration`, `ServerGeneration`)."
            ),
        ] = None,
        keep_sampling_log_probs: Annotated[
            bool | None,
            Option(
                "use the log-probs recorded while sampling as the old log-probs when the trainer needs them (saves a "
                "forward pass). null: when the backend says they are exact (an fp32 vLLM engine without "
                "top-k/top-p); our loop's are equal only to float precision, so by default the trainer recomputes "
                "them."
            ),
        ] = None,
        min_new_tokens: Annotated[
            int, Option("EOS is not sampled before this many tokens (also sampling.min_new_tokens).", NON_NEGATIVE_INT)
        ] = 0,
        disable_dropout: Annotated[
            bool, Option("switch dropout off, so that sampling and scoring see the same network (TRL).")
        ] = True,
        share_prompt_prefix: Annotated[
            bool, Option("score each distinct prompt once, with its responses on top of its cache.")
        ] = True,
        trust_remote_code: Annotated[bool, Option("let transformers run the model repository's code.")] = False,
        tools: Annotated[
            ToolUse | None,
            Option("tool use in rollouts (`ToolUse`: the tools, call format, turns); null: single-turn."),
        ] = None,
        thinking_budget: Annotated[
            ThinkingBudget | None,
            Option("cap on the tokens between `<think>` and `</think>` (`ThinkingBudget`); null: no cap."),
        ] = None,
    ) -> None:
        check_options(HFPolicy, locals())
        super().__init__()
        prompt_encoding.check_prompt_template(prompt_template, system_prompt)
        if lora_r > 0 and not hf_loading.peft_installed():  # before the model loads
            raise ImportError(hf_loading.PEFT_MISSING)
        self.model_name_or_path = model_name_or_path
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.generation = generation or DeviceDefaultGeneration()
        self.keep_sampling_log_probs = keep_sampling_log_probs
        self.min_new_tokens = min_new_tokens
        self.share_prompt_prefix = share_prompt_prefix
        self.segment_rules = [rule for rule in (thinking_budget, tools) if rule is not None]
        self.gradient_checkpointing = gradient_checkpointing
        self.lora_r = lora_r
        self.torch_dtype = DTYPES[dtype]
        self.last_generation_stats: dict[str, float] = {}

        model_source, gguf_name = hf_loading.model_source(model_name_or_path, gguf_file, config)
        self.tokenizer = _load_tokenizer(tokenizer_name_or_path, model_source, gguf_name, trust_remote_code)
        model_kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "dtype": self.torch_dtype}
        if attn_implementation is not None:
            model_kwargs["attn_implementation"] = attn_implementation
        if config is not None:
            model = hf_loading.model_from_config(config, self.tokenizer, model_kwargs)
        else:
            model = hf_loading.load_model(model_source, gguf_name, model_kwargs)
        _prepare_for_training(model, disable_dropout, gradient_checkpointing, lean_activations)
        self.lean_activations = lean_activations  # also the output layer's (`hf_scoring.py`)
        if lora_r > 0:
            model, self._lora_config = hf_loading.add_lora(model, lora_r, lora_alpha, lora_dropout, lora_target_modules)
        self.model = model

        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.eos_token_ids = hf_loading.eos_token_ids(self.tokenizer, self.base_model)
        if not self.eos_token_ids:
            warnings.warn("HFPolicy: neither the tokenizer nor the generation config names an EOS token", stacklevel=2)
        self.max_context: int | None = _max_context(self.hf_config)

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
        return compute_device(self)

    @property
    def sampling_log_probs_exact(self) -> bool:
        if self.keep_sampling_log_probs is not None:
            return self.keep_sampling_log_probs
        return self.generation.exact_log_probs

    # ------------------------------------------------------------------ prompts

    def render_prompt(self, prompt: Any) -> str:
        """The text the model sees for one prompt of a batch."""
        return prompt_encoding.render_prompt(self.tokenizer, prompt, self.prompt_template, self.system_prompt)

    def encode_prompts(self, prompts: Sequence[Any]) -> tuple[list[list[int]], list[str]]:
        """Token ids and rendered text of each prompt."""
        # chat templates write their special tokens themselves; raw text gets the tokenizer's (BOS, ...)
        add_special_tokens = self.prompt_template != "chat"
        return prompt_encoding.encode_prompts(self.tokenizer, prompts, self.render_prompt, add_special_tokens)

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def sample(
        self, batch: PromptBatch, n: int, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Rollout:
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
                        "(max_position_embeddings): "
                        f"at most {self.max_context - sampling.max_new_tokens} prompt tokens fit"
                    )
        min_new_tokens = max(self.min_new_tokens, sampling.min_new_tokens)
        if min_new_tokens != sampling.min_new_tokens:
            sampling = dataclasses.replace(sampling, min_new_tokens=min_new_tokens)
        special = dict(eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id, generator=generator)
        if self.segment_rules:
            out = generate_segments(
                self.generation,
                self.model,
                self.tokenizer,
                prompt_token_ids,
                prompt_texts,
                n,
                sampling,
                self.segment_rules,
                metadata=metadata,
                **special,
            )
        else:
            out = self.generation.generate(self.model, self.tokenizer, prompt_token_ids, n, sampling, **special)
        lengths, response_text = decode_responses(self.tokenizer, out, sampling.stop_strings)
        sampling_log_probs = out.log_probs
        if self.generation.log_probs_renormalised:
            sampling_log_probs = None
            warn_renormalised_log_probs(type(self.generation).__name__)

        device = self.device
        prompt_ids, prompt_mask = left_pad(prompt_token_ids, self.pad_token_id)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        self.last_generation_stats = generation_stats(out, lengths, prompt_mask, len(prompts) * n)
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
            metadata=_row_metadata(metadata, n, out.row_info),
            sampling_log_probs=sampling_log_probs,
            response_source=out.response_source,
        )

    def sampling_copy(self) -> Policy:
        """An engine that holds its own weights samples for this policy as it is (`push_weights` refreshes it);
        our loop samples from a copy of the model sharing the frozen weights, the tokenizer and the backend."""
        if self.generation.owns_weights:
            return self
        memo = {id(p): p for p in self.parameters() if not p.requires_grad}
        memo.update({id(self.tokenizer): self.tokenizer, id(self.generation): self.generation})
        return copy.deepcopy(self, memo)

    # ------------------------------------------------------------------ reference

    def create_reference(self) -> nn.Module:
        if self.lora_r > 0:
            return AdapterReference()
        # share the tokenizer, copy the weights; the reference never samples (no second engine)
        memo = {id(self.tokenizer): self.tokenizer, id(self.generation): KVCacheGeneration()}
        reference = copy.deepcopy(self, memo)
        reference.requires_grad_(False)
        reference.eval()
        return reference

    @torch.no_grad()
    def update_reference(self, reference: nn.Module, alpha: float = 1.0) -> None:
        if not isinstance(reference, AdapterReference):
            super().update_reference(reference, alpha)
            return
        copy_adapter_to_reference(self.model, self._lora_config, reference, alpha)

    def reference_log_probs(self, reference: nn.Module, rollout: Rollout, temperature: float) -> Tensor:
        if not isinstance(reference, AdapterReference):
            return super().reference_log_probs(reference, rollout, temperature)
        with torch.no_grad(), scoring_as_reference(self.model, reference):
            log_probs, _ = self.token_log_probs(rollout, temperature=temperature)
        return log_probs

    # ------------------------------------------------------------------ export

    def save_pretrained(self, directory: str | os.PathLike, merge_lora: bool = True) -> None:
        """Save the model (LoRA merged into a copy of the base weights by default) and the tokenizer."""
        model = merged_copy(self.model) if self.lora_r > 0 and merge_lora else self.model
        model.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))


def _row_metadata(metadata: list[dict], n: int, row_info: list[dict] | None) -> list[dict]:
    """Each prompt's metadata once per response, with what the segment rules said of that response."""
    rows = [dict(m) for m in metadata for _ in range(n)]
    for row, info in zip(rows, row_info or [], strict=False):
        row.update(info)
    return rows


def _load_tokenizer(
    tokenizer_name_or_path: str | None, model_source: Any, gguf_name: str | None, trust_remote_code: bool
):
    """The tokenizer named, else the model's own."""
    if tokenizer_name_or_path is not None:
        return hf_loading.load_tokenizer(resolve_model_path(tokenizer_name_or_path), None, trust_remote_code)
    if model_source is None:
        raise ValueError("HFPolicy(config=...) needs tokenizer_name_or_path (or model_name_or_path) for the tokenizer")
    return hf_loading.load_tokenizer(model_source, gguf_name, trust_remote_code)


def _max_context(hf_config: Any) -> int | None:
    """The longest sequence the model's positions cover (its text decoder's, for a multimodal config)."""
    text_config = hf_config.get_text_config(decoder=True) if hasattr(hf_config, "get_text_config") else hf_config
    return getattr(text_config, "max_position_embeddings", None)


def _prepare_for_training(model: nn.Module, disable_dropout: bool, gradient_checkpointing: bool, lean: bool) -> None:
    if disable_dropout:
        hf_loading.disable_dropout(model)
    # from_pretrained returns the model in eval mode; transformers runs gradient checkpointing only in train mode
    model.train()
    if gradient_checkpointing:
        hf_loading.enable_gradient_checkpointing(model)
    if lean:
        apply_lean_layers(model)
