"""`HFPolicy`: a transformers causal language model as a `Policy` (its options: `rlvr fit --model.policy.help
HFPolicy`, grouped in `policies/hf_options.py`); the model comes from `model.name_or_path`, `model.gguf_file`
or `model.config` (`policies/hf_loading.py`).

Prompts (`batch["prompt"]` items) are rendered by `prompt.template`:

* `"chat"`: the tokenizer's chat template, with the generation prompt appended. A prompt is a user
  message (str) or a list of `{"role", "content"}` messages; `prompt.system_prompt`, if set, is prepended
  unless the messages already start with a system message;
* `"raw"`: the prompt string as is (the tokenizer adds its special tokens, e.g. BOS);
* any other string: a template in which `{prompt}` (and `{system}`, if present) are replaced.

A prompt may also be a list of token ids, used as is (`policies/prompt_encoding.py`).

Three seams, one file each:

* loading (`hf_loading.py`): model, tokenizer, dropout off, gradient checkpointing, LoRA;
* generation (`generation/backend.py`): `generation.backend` picks the backend that samples, our KV-cache
  loop (by default eager on a CPU, over a static cache on a CUDA device) or a vLLM engine. `sample` records
  the sampling log-probs in `rollout.sampling_log_probs` and `last_generation_stats`;
* scoring (`hf_scoring.py`): `token_log_probs`, each distinct prompt run once with the responses on
  top of its cache.

Multi-turn responses: `generation.tools` (`multiturn/tool_use.py`: the policy calls tools mid-response, observations
are appended) and `generation.thinking_budget` (`multiturn/thinking_budget.py`: a forced `</think>` after so many
thinking tokens) generate in segments above the backend (`multiturn/segmented_generation.py`); inserted
tokens have `response_mask` 0 and are recorded in `rollout.response_source`.

Dropout is switched off (`model.disable_dropout`, as in TRL) so that sampling and scoring see the same
network, and the model is put in train mode (transformers only checkpoints activations in train mode).
`model.lean_activations` (on by default) gives Llama-family RMSNorm and SwiGLU layers forwards that keep fewer
tensors for the backward pass, recomputing cheap ones (`policies/lean_layers.py`), and applies the output
layer with `linear_token_log_probs`, whose backward has no logit-sized temporaries (same forward values).
`model.lm_head_fp32` computes every logit (scoring, the reference, our sampling loops) in float32
(`core/float32_head.py`).
`model.compile_layers` runs the decoder layers of scoring's forwards through `torch.compile`
(`policies/compiled_layers.py`).

With LoRA (`lora.r > 0`) the base weights are frozen and the KL reference is the base model with the
adapter disabled: `create_reference` returns a parameter-free marker and no second copy is made
(`policies/lora_reference.py`); over an adapter loaded trained, a frozen copy of it in a second adapter.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from rlvr_lightning.generation.device_default import DeviceDefaultGeneration
from rlvr_lightning.generation.loop import KVCacheGeneration, left_pad
from rlvr_lightning.generation.output import generation_stats
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.multiturn.segmented_generation import decode_responses, generate_segments
from rlvr_lightning.policies import hf_loading, prompt_encoding
from rlvr_lightning.policies.base import Policy, PromptBatch
from rlvr_lightning.policies.compiled_layers import compile_decoder_layers
from rlvr_lightning.policies.hf_options import DTYPES, GenerationOptions, HFModelOptions, LoRAOptions, PromptOptions
from rlvr_lightning.policies.hf_scoring import HFScoring
from rlvr_lightning.policies.lean_layers import apply_lean_layers
from rlvr_lightning.policies.lora_reference import (
    AdapterReference,
    add_reference_adapter,
    copy_adapter_to_reference,
    fresh_adapter,
    holds_reference_adapter,
    merged_copy,
    scoring_as_reference,
)
from rlvr_lightning.policies.prompt_summary import mean_prompt_state
from rlvr_lightning.rollout import Rollout
from rlvr_lightning.runtime.devices import compute_device
from rlvr_lightning.runtime.model_cache import resolve_model_path
from rlvr_lightning.runtime.option_declarations import Option, documented_options


@functools.cache
def warn_renormalised_log_probs(backend: str) -> None:
    warnings.warn(
        f"{backend}: with top_k/top_p/min_p the engine's log-probs are renormalised over the kept tokens, so the "
        "rollouts record no sampling log-probs: no train/mismatch metrics and no rollout_is weights. Sample with "
        "top_p: 1, top_k: 0 and min_p: 0, or with KVCacheGeneration, which records the unfiltered log-probs",
        stacklevel=3,
    )


@documented_options
class HFPolicy(HFScoring, Policy):
    """A Hugging Face causal LM policy (see the module docstring)."""

    def __init__(
        self,
        model: Annotated[HFModelOptions, Option("the model, its tokenizer and dtype (name_or_path, config, ...).")] = (
            HFModelOptions()
        ),
        lora: Annotated[LoRAOptions, Option("a LoRA adapter (r, alpha, dropout, target_modules; r 0: none).")] = (
            LoRAOptions()
        ),
        prompt: Annotated[PromptOptions, Option("how prompts become text (template, system_prompt).")] = (
            PromptOptions()
        ),
        generation: Annotated[
            GenerationOptions,
            Option(
                "how responses are generated (backend, keep_sampling_log_probs, min_new_tokens, "
                "share_prompt_prefix, tools, thinking_budget)."
            ),
        ] = GenerationOptions(),
    ) -> None:
        super().__init__()
        _check_groups(model=model, lora=lora, prompt=prompt, generation=generation)
        if lora.r > 0 and not hf_loading.peft_installed():  # before the model loads
            raise ImportError(hf_loading.PEFT_MISSING)
        self.model_name_or_path = model.name_or_path
        self.prompt_template = prompt.template
        self.system_prompt = prompt.system_prompt
        self.generation = generation.backend or DeviceDefaultGeneration()
        self.keep_sampling_log_probs = generation.keep_sampling_log_probs
        self.min_new_tokens = generation.min_new_tokens
        self.share_prompt_prefix = generation.share_prompt_prefix
        self.packed_attention = model.packed_attention
        self.segment_rules = [rule for rule in (generation.thinking_budget, generation.tools) if rule is not None]
        self.gradient_checkpointing = model.gradient_checkpointing
        self.lora_r = lora.r
        self.torch_dtype = DTYPES[model.dtype]
        self.last_generation_stats: dict[str, float] = {}

        model_source, gguf_name = hf_loading.model_source(model.name_or_path, model.gguf_file, model.config)
        self.tokenizer = _load_tokenizer(model.tokenizer, model_source, gguf_name, model.trust_remote_code)
        model_kwargs: dict[str, Any] = {"trust_remote_code": model.trust_remote_code, "dtype": self.torch_dtype}
        if model.attn_implementation is not None:
            model_kwargs["attn_implementation"] = model.attn_implementation
        if model.config is not None:
            network = hf_loading.model_from_config(model.config, self.tokenizer, model_kwargs)
        else:
            network = hf_loading.load_model(model_source, gguf_name, model_kwargs)
        # compiled layers keep transformers' norms and MLPs: a lean forward per module would be a graph per layer
        # (`auto` drops them where it compiles)
        lean_layers = model.lean_activations and model.compile_layers in ("none", "auto")
        _prepare_for_training(network, model.disable_dropout, model.gradient_checkpointing, lean_layers)
        compile_decoder_layers(network, model.compile_layers)
        self.lean_activations = model.lean_activations  # also the output layer's (`hf_scoring.py`)
        if lora.r > 0:
            network, self._lora_config = hf_loading.add_lora(
                network, lora.r, lora.alpha, lora.dropout, lora.target_modules
            )
            self._register_load_state_dict_pre_hook(self._add_reference_adapter_to_load)
        if model.gradient_checkpointing:  # after LoRA, whose wrapper adds one over a checkpointed model
            hf_loading.drop_input_grad_hooks(network)
        if model.lm_head_fp32:  # after LoRA: an adapter on the head is refused
            hf_loading.float32_output_layer(network.get_base_model() if lora.r > 0 else network)
        self.model = network

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
            prompts=[prompt for prompt in prompts for _ in range(n)],
            response_text=response_text,
            metadata=_row_metadata(metadata, n, out.row_info),
            sampling_log_probs=sampling_log_probs,
            response_source=out.response_source,
        )

    def prompt_state(self, rollout: Rollout) -> Tensor:
        """The mean of the decoder's last hidden states over each prompt's tokens but its last (`prompt_summary.py`)."""
        return mean_prompt_state(self.base_model.get_decoder(), rollout.prompt_ids, rollout.prompt_mask)

    def sampling_copy(self) -> Policy:
        """An engine that holds its own weights samples for this policy as it is (`push_weights` refreshes it);
        our loop samples from a copy of the model sharing the frozen weights, the tokenizer and the backend."""
        if self.generation.owns_weights:
            return self
        memo = {id(p): p for p in self.parameters() if not p.requires_grad}
        memo.update({id(self.tokenizer): self.tokenizer, id(self.generation): self.generation})
        return copy.deepcopy(self, memo)

    # ------------------------------------------------------------------ reference

    def create_reference(self, adapter: bool = True) -> nn.Module:
        """A frozen copy; with LoRA (and `adapter`) the model itself with its adapter disabled or copied."""
        if self.lora_r > 0 and adapter:
            reference = AdapterReference()
            if not fresh_adapter(self.model):  # loaded trained: the reference is the policy as it is now
                copy_adapter_to_reference(self.model, self._lora_config, reference, 1.0)
            return reference
        # share the tokenizer, copy the weights; the reference never samples (no second engine)
        memo = {id(self.tokenizer): self.tokenizer, id(self.generation): KVCacheGeneration()}
        reference = copy.deepcopy(self, memo)
        reference.requires_grad_(False)
        reference.eval()
        return reference

    def _add_reference_adapter_to_load(self, state_dict: dict, prefix: str, *_: Any) -> None:
        """A checkpoint taken after the KL reference became an adapter copy holds that adapter's weights."""
        if holds_reference_adapter(state_dict, prefix + "model."):
            add_reference_adapter(self.model, self._lora_config)

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

    @contextlib.contextmanager
    def reference_scoring(self, reference: nn.Module) -> Iterator[Policy]:
        if not isinstance(reference, AdapterReference):
            with super().reference_scoring(reference) as scorer:
                yield scorer
            return
        with torch.no_grad(), scoring_as_reference(self.model, reference):
            yield self

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


GROUPS = {"model": HFModelOptions, "lora": LoRAOptions, "prompt": PromptOptions, "generation": GenerationOptions}


def _check_groups(**groups: Any) -> None:
    """A clear error for a group given as something else (in Python, e.g. a backend as `generation`)."""
    for name, value in groups.items():
        if not isinstance(value, GROUPS[name]):
            raise TypeError(
                f"HFPolicy {name}= takes a {GROUPS[name].__name__}, got {type(value).__name__}: "
                f"e.g. HFPolicy(generation=GenerationOptions(backend=VLLMGeneration()), lora=LoRAOptions(r=16))"
            )


def _load_tokenizer(
    tokenizer_name_or_path: str | None, model_source: Any, gguf_name: str | None, trust_remote_code: bool
):
    """The tokenizer named, else the model's own."""
    if tokenizer_name_or_path is not None:
        path = resolve_model_path(tokenizer_name_or_path, "Tokenizer")
        return hf_loading.load_tokenizer(path, None, trust_remote_code)
    if model_source is None:
        raise ValueError("HFPolicy(model.config=...) needs model.tokenizer (or model.name_or_path) for the tokenizer")
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
