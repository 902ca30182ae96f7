"""`HFPolicy`'s options, in four groups: the model (`model`), its LoRA adapter (`lora`), how prompts become text
(`prompt`) and how responses are generated (`generation`).

    policy:
      class_path: rlvr_lightning.policies.HFPolicy
      init_args:
        model: {name_or_path: smollm2-135m-instruct, dtype: bfloat16}
        lora: {r: 16, alpha: 32}
        prompt: {template: chat, system_prompt: "Think step by step."}
        generation: {backend: {class_path: rlvr_lightning.generation.VLLMGeneration}}

Keys left out keep the defaults shown here; each option declares its help and domain beside it
(`runtime/option_declarations.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch

from rlvr_lightning.generation.backend import GenerationBackend
from rlvr_lightning.multiturn.segmented_generation import SegmentRule
from rlvr_lightning.multiturn.thinking_budget import ThinkingBudget
from rlvr_lightning.policies import prompt_encoding
from rlvr_lightning.policies.compiled_layers import COMPILE_LAYERS
from rlvr_lightning.policies.flex_packing import PACKED_ATTENTION
from rlvr_lightning.runtime.option_declarations import Option, check_options, documented_options
from rlvr_lightning.runtime.option_domains import NON_NEGATIVE_INT, OneOf, Range

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@documented_options
@dataclass(frozen=True)
class HFModelOptions:
    """The model: where it comes from, its tokenizer and dtype, and how it is prepared for training."""

    name_or_path: Annotated[
        str | None,
        Option("a local directory, hub id or `rlvr-models` alias of the model (null: gguf_file or config)."),
    ] = None
    gguf_file: Annotated[str | None, Option("a GGUF file to load the model from (`policies/hf_loading.py`).")] = None
    config: Annotated[
        dict[str, Any] | str | None,
        Option("a transformers config (mapping or path): a model of that shape with random weights."),
    ] = None
    tokenizer: Annotated[str | None, Option("the tokenizer's directory or hub id (null: the model's).")] = None
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"], Option("the dtype of the weights.", OneOf(tuple(DTYPES)))
    ] = "float32"
    attn_implementation: Annotated[
        str | None, Option("transformers' attention implementation (null: transformers' default).")
    ] = "sdpa"
    trust_remote_code: Annotated[bool, Option("let transformers run the model repository's code.")] = False
    gradient_checkpointing: Annotated[
        bool, Option("recompute activations in the backward pass instead of keeping them.")
    ] = False
    lean_activations: Annotated[
        bool,
        Option(
            "RMSNorm and SwiGLU layers keep fewer activations for the backward pass (fewer bytes per token; "
            "same forward values, gradients equal to float rounding)."
        ),
    ] = True
    disable_dropout: Annotated[
        bool, Option("switch dropout off, so that sampling and scoring see the same network (TRL).")
    ] = True
    packed_attention: Annotated[
        Literal["auto", "flex", "model"],
        Option(
            "the attention kernel of packed scoring (`update.micro_batch_tokens`): flex (FlexAttention with a block "
            "mask from the rows' boundaries), model (attn_implementation with transformers' packed mask), auto "
            "(flex on a CUDA device where the model allows it and attn_implementation is sdpa or eager, else model).",
            OneOf(PACKED_ATTENTION),
        ),
    ] = "auto"
    lm_head_fp32: Annotated[
        bool,
        Option(
            "compute the logits (scoring, the reference, sampling with our loops) as a float32 GEMM of float32 "
            "hidden states and weight whatever autocast or dtype say (MiniMax-M1, ScaleRL: the LM head's precision "
            "made the sampler's and trainer's probabilities differ). An untied head's parameters are stored (and "
            "under FSDP2 gathered) in float32; a head tied to the embeddings keeps the shared weight's dtype and is "
            "upcast for the GEMM. Not with a LoRA adapter on the head (`core/float32_head.py`)."
        ),
    ] = False
    compile_layers: Annotated[
        Literal["auto", "none", "default", "aot_eager"],
        Option(
            "run the decoder layers of the forwards without a key/value cache (scoring without prefix sharing, "
            "packed micro-batches) through torch.compile: auto (inductor on a CUDA device, unsharded layers; as "
            "written elsewhere), default (inductor), aot_eager (traced, run by torch's operators), none. Compiled "
            "layers run transformers' norms and MLPs (the compiler picks what their backward keeps); "
            "lean_activations then applies to the output layer alone (`policies/compiled_layers.py`).",
            OneOf(COMPILE_LAYERS),
        ),
    ] = "auto"

    def __post_init__(self) -> None:
        check_options(HFModelOptions, vars(self), "model.")


@documented_options
@dataclass(frozen=True)
class LoRAOptions:
    """A LoRA adapter (peft): with `r > 0` the base weights are frozen and only the adapter trains."""

    r: Annotated[int, Option("the LoRA rank (0: no LoRA, the full model trains).", NON_NEGATIVE_INT)] = 0
    alpha: Annotated[float, Option("LoRA's scale numerator (scale alpha / r).", Range(0, low_open=True))] = 16.0
    dropout: Annotated[float, Option("dropout on the LoRA adapter's input.", Range(0, 1, high_open=True))] = 0.0
    target_modules: Annotated[
        list[str] | str | None, Option("the modules LoRA adapts (peft's target_modules; all-linear: every linear).")
    ] = "all-linear"

    def __post_init__(self) -> None:
        check_options(LoRAOptions, vars(self), "lora.")


@documented_options
@dataclass(frozen=True)
class PromptOptions:
    """How a prompt becomes the text the model sees (`policies/prompt_encoding.py`)."""

    template: Annotated[
        str,
        Option(
            "chat (the tokenizer's chat template) | raw (the prompt as is) | a template with {prompt} (and {system})."
        ),
    ] = "chat"
    system_prompt: Annotated[str | None, Option("a system message put before each chat prompt (null: none).")] = None

    def __post_init__(self) -> None:
        prompt_encoding.check_prompt_template(self.template, self.system_prompt)


@documented_options
@dataclass(frozen=True)
class GenerationOptions:
    """How responses are generated: the backend that samples, and what is generated above it."""

    backend: Annotated[
        GenerationBackend | None,
        Option(
            "the backend that samples (default `DeviceDefaultGeneration`: our loop, over a static cache with a "
            "graph-held step on a CUDA device (`StaticCacheGeneration`), eager elsewhere (`KVCacheGeneration`); "
            "or `VLLMGeneration`, `ServerGeneration`)."
        ),
    ] = None
    keep_sampling_log_probs: Annotated[
        bool | None,
        Option(
            "use the log-probs recorded while sampling as the old log-probs when the trainer needs them (saves a "
            "forward pass). null: when the backend says they are exact (an fp32 vLLM engine without "
            "top-k/top-p); our loop's are equal only to float precision, so by default the trainer recomputes "
            "them."
        ),
    ] = None
    min_new_tokens: Annotated[
        int, Option("EOS is not sampled before this many tokens (also sampling.min_new_tokens).", NON_NEGATIVE_INT)
    ] = 0
    share_prompt_prefix: Annotated[
        bool | None,
        Option(
            "score each distinct prompt once, with its responses on top of its cache (two forwards per call), "
            "instead of one forward over prompt + response per row. null: by device (`prefix_sharing_default`): "
            "on a CPU, where the positions saved pay; off on a GPU, where the second forward's kernel launches "
            "cost more than the positions save."
        ),
    ] = None
    tools: Annotated[
        SegmentRule | None,
        Option(
            "what makes a response multi-turn: tool use (`ToolUse`: the tools, call format, turns), a verifiers "
            "environment's turns (`VerifiersTurns`) or another `SegmentRule`; null: single-turn."
        ),
    ] = None
    thinking_budget: Annotated[
        ThinkingBudget | None,
        Option("cap on the tokens between `<think>` and `</think>` (`ThinkingBudget`); null: no cap."),
    ] = None

    def __post_init__(self) -> None:
        check_options(GenerationOptions, vars(self), "generation.")
