"""Scoring responses with a Hugging Face causal LM: differentiable log-probs (and entropy) of the tokens of a
`Rollout` (and of a support of other tokens: `policies/token_scores.py`).

Each distinct prompt of the rows runs through the model once and its rows' responses run on top of its key/value
cache (`share_prompt_prefix`; the rows of a group share their prompt), which saves most of the prompt's share of the
forward and backward passes. Where that cannot apply (sliding windows, gradient checkpointing, rows that share
nothing) one joint forward over prompt + response gives the same numbers.

With `packed_sequences` (set by the update when `update.micro_batch_tokens` is) the rows run padding-free as one
packed sequence instead (`policies/packing.py`), unless prefix sharing costs fewer positions.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlvr_lightning.core.float32_head import Float32Head
from rlvr_lightning.generation.kv_cache import returned_cache
from rlvr_lightning.generation.loop import position_ids_from_mask
from rlvr_lightning.policies.base import LogitStatistic
from rlvr_lightning.policies.flex_packing import (
    FLEX_IMPLEMENTATION,
    attention_implementation,
    flex_compile_failed,
    register_flex_attention,
    use_flex,
)
from rlvr_lightning.policies.packing import PackedOutput, layout_and_ids, packed_cost, packed_inputs, row_lengths
from rlvr_lightning.policies.prefix_sharing import (
    NotAPlainCache,
    layers_allow_prefix_sharing,
    prefix_sharing_default,
    shared_prefix_forward,
)
from rlvr_lightning.policies.token_scores import (
    Scores,
    Support,
    chosen_log_probs,
    empty_support,
    last_positions,
    support_scores,
    unpacked,
)
from rlvr_lightning.rollout import Rollout

#: causal LMs whose logits are their decoder's last hidden states through a plain linear head
LEAN_CAUSAL_LMS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


class _Output(NamedTuple):
    logits: Tensor | None
    hidden: Tensor | None
    cache: Any


class HFScoring:
    """`token_log_probs` for `HFPolicy` (a mixin: needs `model`, `base_model`, `hf_config`,
    `share_prompt_prefix` and `gradient_checkpointing`)."""

    model: nn.Module
    share_prompt_prefix: bool | None
    gradient_checkpointing: bool
    #: `response_hidden_states` runs the decoder alone (no LM head); off, the whole model runs (one position's
    #: logits). Sharding turns it off: FSDP2 gathers the parameters outside the blocks in the model's own forward.
    decoder_only_hidden_states: bool = True
    #: score the rows of a call as one padding-free packed sequence (`update.micro_batch_tokens` turns it on)
    packed_sequences: bool = False
    #: the attention kernel of packed scoring: auto, flex or model (`policies/flex_packing.py`)
    packed_attention: str = "auto"
    #: `lean_activations`: a Llama-family output layer is applied by `linear_token_log_probs` (no logit-sized
    #: temporaries in the backward)
    lean_activations: bool = False

    def token_log_probs(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs `[N, T]` of `rollout.response_ids` at `temperature` (0 on masked positions), and the
        token entropy `[N, T]` if asked; `entropy_grad=False` computes it detached (a logged metric only),
        without keeping its `[N, T, V]` intermediates for the backward pass."""
        scores = self._score(rollout, temperature, with_entropy, entropy_grad, with_hidden=False)
        return scores.log_probs, scores.entropy

    def token_log_probs_and_hidden(
        self, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """`token_log_probs` and the last layer's hidden states `[N, T, H]` of the same forward (the
        positions whose logits score each response token; 0 on masked positions)."""
        return self._score(rollout, temperature, with_entropy, entropy_grad, with_hidden=True)[:3]

    def support_log_probs(
        self, rollout: Rollout, support: Tensor, temperature: float = 1.0, with_entropy: bool = False,
        entropy_grad: bool = True,
    ) -> tuple[Tensor, Tensor | None, Tensor]:  # fmt: skip
        """`Policy.support_log_probs`: from the logits of the same forward (the lean output layer does not apply)."""
        scores = self._score(rollout, temperature, with_entropy, entropy_grad, False, Support(ids=support))
        return scores.log_probs, scores.entropy, scores.support

    def top_k_scores(
        self, rollout: Rollout, k: int, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """`Policy.top_k_scores` from one forward: the candidates found in its own logits."""
        scores = self._score(rollout, temperature, with_entropy, entropy_grad, False, Support(top_k=k))
        return scores.log_probs, scores.entropy, scores.support, scores.support_ids

    def response_hidden_states(self, rollout: Rollout) -> Tensor:
        """The hidden states of `token_log_probs_and_hidden` from the decoder alone (no LM head, no logits)."""
        num_rows, width = rollout.response_ids.shape
        if width == 0:
            return rollout.response_mask.new_zeros((num_rows, 0, self.hidden_size))
        if self._packing_pays(rollout):
            packed = self._packed_forward(rollout, with_logits=False, with_hidden=True)
            keep = (rollout.response_mask[packed.rows, packed.columns] > 0).unsqueeze(-1)
            return unpacked(torch.where(keep, packed.hidden, 0.0), packed, (num_rows, width))
        _, hidden, t = self._forward_response(rollout, with_logits=False, with_hidden=True)
        mask = (rollout.response_mask[:, :t] > 0).unsqueeze(-1)
        return F.pad(torch.where(mask, hidden, 0.0), (0, 0, 0, width - t))

    @property
    def hidden_size(self) -> int:
        config = (
            self.hf_config.get_text_config(decoder=True)
            if hasattr(self.hf_config, "get_text_config")
            else self.hf_config
        )
        return int(config.hidden_size)

    def _score(
        self, rollout: Rollout, temperature: float, with_entropy: bool, entropy_grad: bool, with_hidden: bool,
        support: Support | None = None,
    ) -> Scores:  # fmt: skip
        num_rows, width = rollout.response_ids.shape
        if width == 0:
            empty = rollout.response_mask.new_zeros((num_rows, 0))
            hidden = rollout.response_mask.new_zeros((num_rows, 0, self.hidden_size)) if with_hidden else None
            return Scores(empty, (empty if with_entropy else None), hidden, *empty_support(support, num_rows, empty))
        head = None if support is not None else self._output_layer(with_entropy and entropy_grad)
        if self._packing_pays(rollout):
            return self._packed_score(rollout, temperature, with_entropy, entropy_grad, with_hidden, head, support)
        lean = head is not None
        logits, hidden, t = self._forward_response(rollout, with_logits=not lean, with_hidden=with_hidden or lean)
        mask = rollout.response_mask[:, :t] > 0
        ids = rollout.response_ids[:, :t]
        log_probs, entropy = chosen_log_probs(logits, hidden, head, ids, temperature, with_entropy, entropy_grad)
        values, value_ids = support_scores(
            logits, None if support is None else support.at((slice(None), slice(None, t))), temperature
        )

        def padded(x: Tensor | None) -> Tensor | None:  # [N, t, ...] -> [N, width, ...], 0 where masked
            if x is None:
                return None
            keep = mask.view(*mask.shape, *([1] * (x.ndim - 2)))
            return F.pad(torch.where(keep, x, 0), (0, 0) * (x.ndim - 2) + (0, width - t))

        hidden = padded(hidden) if with_hidden else None
        return Scores(padded(log_probs), padded(entropy), hidden, padded(values), padded(value_ids))

    def _packed_score(
        self,
        rollout: Rollout,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        with_hidden: bool,
        head: nn.Linear | None,
        support: Support | None,
    ) -> Scores:
        """`_score` from one packed forward: log-probs of the `[K, V]` scored positions alone, then put in place."""
        packed = self._packed_forward(rollout, with_logits=head is None, with_hidden=with_hidden or head is not None)
        shape = tuple(rollout.response_ids.shape)
        # [K, 1, V]: the detached entropy's row chunks then bound its temporaries as on the padded path
        logits = None if packed.logits is None else packed.logits.unsqueeze(1)
        ids = rollout.response_ids[packed.rows, packed.columns].unsqueeze(1)
        states = None if packed.hidden is None else packed.hidden.unsqueeze(1)
        keep = rollout.response_mask[packed.rows, packed.columns] > 0
        log_probs, entropy = chosen_log_probs(logits, states, head, ids, temperature, with_entropy, entropy_grad)
        at = None if support is None else support.at((packed.rows, packed.columns))
        values, value_ids = support_scores(packed.logits, at, temperature)

        def placed(x: Tensor | None) -> Tensor | None:  # [K, ...] -> [N, T, ...], 0 where masked
            if x is None:
                return None
            return unpacked(torch.where(keep.view(-1, *([1] * (x.ndim - 1))), x, 0), packed, shape)

        squeezed = (None if x is None else x.squeeze(1) for x in (log_probs, entropy))
        hidden = packed.hidden if with_hidden else None
        return Scores(*(placed(x) for x in (*squeezed, hidden, values, value_ids)))

    def _output_layer(self, entropy_gradient: bool) -> nn.Linear | None:
        """The output layer that `linear_token_log_probs` applies to the decoder's hidden states (`lean_activations`:
        a plain linear head of a Llama-family model, unsharded, without forward hooks, no entropy gradient); None:
        the model's forward computes the logits."""
        if entropy_gradient or not (self.lean_activations and self.decoder_only_hidden_states):
            return None
        if type(self.base_model).__name__ not in LEAN_CAUSAL_LMS:
            return None
        head = self.base_model.get_output_embeddings()
        hooked = head is not None and (head._forward_hooks or head._forward_pre_hooks)  # they see the logits
        return head if type(head) in (nn.Linear, Float32Head) and not hooked else None

    def _packed_forward(self, rollout: Rollout, with_logits: bool, with_hidden: bool) -> PackedOutput:
        """Logits `[K, V]` and/or last hidden states `[K, H]` of the positions scoring each response token of
        `rollout` (rows and columns in `PackedOutput`), from one padding-free forward."""
        layout, ids = layout_and_ids(rollout)
        dtype = next(self.base_model.parameters()).dtype
        index = layout.score_index
        keep_indices = with_logits and self._logits_to_keep_supported()

        def forward(flex: bool):
            inputs = packed_inputs(self.base_model, self.hf_config, layout, ids, dtype, flex)
            with attention_implementation(self.hf_config, FLEX_IMPLEMENTATION) if flex else contextlib.nullcontext():
                return self._run(with_logits, with_hidden, keep=index if keep_indices else 0, **inputs)

        flex = self.packed_attention_kernel(ids.device) == FLEX_IMPLEMENTATION
        try:
            out = forward(flex)
        except torch._dynamo.exc.TorchDynamoException as error:
            if not (flex and self.packed_attention == "auto"):
                raise
            flex_compile_failed(self, ids.device, error)
            out = forward(False)
        logits = None
        if with_logits:
            logits = out.logits[0] if keep_indices else out.logits[0, index]
        hidden = None if out.hidden is None else out.hidden[0, index]
        return PackedOutput(logits, hidden, layout.score_rows, layout.score_columns)

    def packed_attention_kernel(self, device: torch.device) -> str:
        """The attention implementation packed scoring runs on `device` (`packed_attention`; decided once per
        setting: the check looks through the model's modules)."""
        key = self._packed_kernel_key(device)
        decided = self.__dict__.setdefault("_packed_kernels", {})
        if key not in decided:
            decided[key] = use_flex(
                self.packed_attention, self.base_model, self.hf_config, device, self.gradient_checkpointing
            )
        if decided[key]:
            register_flex_attention()
            return FLEX_IMPLEMENTATION
        return str(self.hf_config._attn_implementation)

    def _packed_kernel_key(self, device: torch.device) -> tuple:
        return (self.packed_attention, device.type, self.gradient_checkpointing, self.hf_config._attn_implementation)

    def _packing_pays(self, rollout: Rollout) -> bool:
        """Packed scoring, unless prefix sharing runs fewer positions (each distinct prompt once, the responses
        padded to the longest); decided from the rows' `row_lengths`, without reading the device again."""
        if not self.packed_sequences:
            return False
        if not self._shares_prefixes(rollout.prompt_ids.device):
            return True
        lengths = row_lengths(rollout)
        distinct = len(set(zip(lengths.prompt_hash, lengths.prompt, strict=True)))
        if distinct * 4 > rollout.num_rows * 3:  # prefix sharing would fall back to the joint forward
            return True
        width = max(lengths.prompt, default=0)  # the left-padded prompts' used columns
        responses = max(max(lengths.scored, default=0) - 1, 0)  # t - 1 response positions per row
        return packed_cost(lengths) <= distinct * width + rollout.num_rows * responses

    @torch.no_grad()
    def logit_statistics(self, rollout: Rollout, statistic: LogitStatistic, temperature: float = 1.0) -> Tensor:
        """`Policy.logit_statistics` from the logits of one forward over the padded rows."""
        num_rows, width = rollout.response_ids.shape
        if width == 0:
            return rollout.response_mask.new_zeros((num_rows, 0))
        logits, _, t = self._forward_response(rollout)
        values = statistic(logits, rollout.response_ids[:, :t], temperature)
        return F.pad(torch.where(rollout.response_mask[:, :t] > 0, values, 0.0), (0, width - t))

    def _forward_response(
        self, rollout: Rollout, with_logits: bool = True, with_hidden: bool = False
    ) -> tuple[Tensor | None, Tensor | None, int]:
        """Logits `[N, t, V]` and/or last hidden states `[N, t, H]` of the positions predicting
        `response_ids[:, :t]` (t = last masked column + 1). Without logits only the decoder runs."""
        prompt_mask = rollout.prompt_mask
        used_prompt = prompt_mask.bool().any(0).nonzero()
        if used_prompt.numel() == 0:
            raise ValueError("token_log_probs: every prompt in the rows is empty")
        first = int(used_prompt[0].item())
        used_response = rollout.response_mask.bool().any(0).nonzero()
        t = int(used_response[-1].item()) + 1 if used_response.numel() else 1
        t = min(t, rollout.response_ids.shape[1])
        prompt_ids, prompt_mask = rollout.prompt_ids[:, first:], prompt_mask[:, first:]
        if self._shares_prefixes(prompt_ids.device):
            shared = self._shared_prefix_forward(
                prompt_ids, prompt_mask, rollout.response_ids[:, : t - 1], with_logits, with_hidden
            )
            if shared is not None:
                return (*shared, t)
        ids = torch.cat([prompt_ids, rollout.response_ids[:, : t - 1]], dim=1)
        mask = torch.cat(
            [prompt_mask, torch.ones_like(rollout.response_ids[:, : t - 1], dtype=prompt_mask.dtype)], dim=1
        )
        out = self._run(
            with_logits,
            with_hidden,
            keep=t,
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            use_cache=False,
        )
        return last_positions(out.logits, t), last_positions(out.hidden, t), t

    def _run(self, with_logits: bool, with_hidden: bool, keep: int, **inputs: Any) -> _Output:
        """One forward: the causal LM (logits of the last `keep` positions, and the last layer's hidden states
        if asked) or, without logits, the decoder alone (its last hidden states; `decoder_only_hidden_states`)."""
        if not with_logits and self.decoder_only_hidden_states:
            out = self.base_model.get_decoder()(**inputs)
            return _Output(None, out.last_hidden_state, returned_cache(out))
        if not with_logits:
            keep = 1  # the fewest logits (0 would keep them all)
        kwargs: dict[str, Any] = {"logits_to_keep": keep} if self._logits_to_keep_supported() else {}
        if with_hidden:
            kwargs["output_hidden_states"] = True
        out = self.model(**inputs, **kwargs)
        hidden = out.hidden_states[-1] if with_hidden else None  # after the final norm: what the LM head reads
        return _Output(out.logits if with_logits else None, hidden, returned_cache(out))

    def _shared_prefix_forward(
        self, prompt_ids: Tensor, prompt_mask: Tensor, responses: Tensor, with_logits: bool, with_hidden: bool
    ) -> tuple[Tensor | None, Tensor | None] | None:
        """`shared_prefix_forward` of this policy's model; None where the rows share no prompts or the model's
        cache proves not a plain KV cache (then never again)."""
        try:
            return shared_prefix_forward(
                self._run, self.model, self.hf_config, prompt_ids, prompt_mask, responses, with_logits, with_hidden
            )
        except NotAPlainCache:
            self._prefix_sharing = False  # sliding windows, linear attention, ...: always the joint forward
            return None

    def _shares_prefixes(self, device: torch.device) -> bool:
        """Whether the rows' prompts are scored once per group: `share_prompt_prefix`, else by `device`, where the
        model's layers allow it."""
        choice = self.share_prompt_prefix
        return (prefix_sharing_default(device) if choice is None else choice) and self._prefix_sharing_supported()

    def _prefix_sharing_supported(self) -> bool:
        if getattr(self, "_prefix_sharing", None) is None:  # False once a model's cache proved not a plain KV cache
            self._prefix_sharing = layers_allow_prefix_sharing(self.hf_config, self.gradient_checkpointing)
        return self._prefix_sharing

    def _logits_to_keep_supported(self) -> bool:
        supported = getattr(self, "_logits_to_keep", None)
        if supported is None:
            supported = "logits_to_keep" in inspect.signature(self.base_model.forward).parameters
            self._logits_to_keep = supported
        return supported
