"""Per-token log-probabilities of chosen tokens from logits.

The trainer passes the logits that PREDICT each response token (i.e. already
shifted by one position) and the response token ids.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def token_log_probs_from_logits(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[..., token_ids]`` -> ``[N, T]``.

    Computed as ``gather(logits) - logsumexp(logits)``, which never
    materialises a second ``[N, T, V]`` log-softmax tensor. Half/bf16 logits are
    upcast to float32 first (the result is float32); use the same
    ``temperature`` as the sampler so that log-probs match the behaviour policy.
    """
    logits = _scaled(logits, temperature)
    chosen = torch.gather(logits, dim=-1, index=token_ids.long().unsqueeze(-1)).squeeze(-1)
    # log p(y_t) = l_{y_t} - logsumexp_v l_v  (verl torch_functional.logprobs_from_logits_v2)
    return chosen - torch.logsumexp(logits, dim=-1)


def support_log_probs_from_logits(logits: Tensor, support: Tensor, temperature: float = 1.0) -> Tensor:
    """``[..., k]`` the log-probs of the ``support`` token ids ``[..., k]`` at each position of ``logits``
    ``[..., V]`` (at ``temperature``; float32, differentiable): the log-probs a logit-level distillation loss compares
    with the teacher's."""
    logits = _scaled(logits, temperature)
    return torch.gather(logits, dim=-1, index=support.long()) - torch.logsumexp(logits, dim=-1, keepdim=True)


@torch.no_grad()
def top_log_probs_from_logits(logits: Tensor, k: int, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """``([..., k], [..., k])`` the log-probs of the ``k`` most probable tokens at each position of ``logits``
    ``[..., V]`` (at ``temperature``, most probable first) and their ids."""
    if not 0 < k <= logits.shape[-1]:
        raise ValueError(f"top-k log-probs: k must be in [1, {logits.shape[-1]}] (the vocabulary), got {k}")
    logits = _scaled(logits, temperature)
    values, ids = torch.topk(logits, k, dim=-1)
    return values - torch.logsumexp(logits, dim=-1, keepdim=True), ids


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """float32 logits divided by the temperature."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


# rows of the detached entropy computed at once: bounds its [rows, T, V] temporaries
_ENTROPY_CHUNK_ELEMENTS = 1 << 24


def _by_row_chunks(fn, *tensors: Tensor) -> Tensor:
    """``fn`` over chunks of rows of ``tensors`` (split alike along dim 0) of at most ``_ENTROPY_CHUNK_ELEMENTS``
    elements of the first, concatenated: its ``[.., V]`` temporaries never exceed one chunk's."""
    if tensors[0].shape[0] == 0:
        return fn(*tensors)
    rows = max(1, _ENTROPY_CHUNK_ELEMENTS // max(1, tensors[0][0].numel()))
    return torch.cat([fn(*chunk) for chunk in zip(*(t.split(rows) for t in tensors), strict=True)])


def token_log_probs_and_entropy(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, entropy_grad: bool = True
) -> tuple[Tensor, Tensor]:
    """``token_log_probs_from_logits`` and the entropy of each position's distribution, from one logsumexp.

    H = log Z - sum_v p_v l_v with p = exp(l - log Z) (verl torch_functional.entropy_from_logits);
    probability-0 (-inf) entries contribute 0. ``entropy_grad=False`` computes the entropy without
    autograd (a logged metric) in row chunks, so none of its ``[.., V]`` temporaries outlive the call.
    """
    logits = _scaled(logits, temperature)
    log_z = torch.logsumexp(logits, dim=-1)
    chosen = torch.gather(logits, dim=-1, index=token_ids.long().unsqueeze(-1)).squeeze(-1)
    log_probs = chosen - log_z
    if entropy_grad:
        return log_probs, _entropy(logits, log_z)
    with torch.no_grad():
        return log_probs, _by_row_chunks(_entropy, logits.detach(), log_z.detach())


def _entropy(logits: Tensor, log_z: Tensor) -> Tensor:
    probs = torch.exp(logits - log_z.unsqueeze(-1))
    # 0 * -inf = NaN on probability-0 tokens: nansum drops them (a NaN logit already made log_z NaN)
    return log_z - (probs * logits).nansum(dim=-1)


@torch.no_grad()
def token_energy_from_logits(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``||onehot(y) - p||^2 = 1 - 2 p_y + sum_v p_v^2`` per position, ``p = softmax(logits / temperature)``: the
    squared norm of the gradient of ``log p_y`` in the logits (OTB's logit-gradient proxy), without autograd, in row
    chunks that bound its ``[.., V]`` temporaries."""

    def energy(chunk: Tensor, ids: Tensor) -> Tensor:
        chunk = _scaled(chunk, temperature)
        log_z = torch.logsumexp(chunk, dim=-1)
        chosen = torch.gather(chunk, dim=-1, index=ids.long().unsqueeze(-1)).squeeze(-1) - log_z
        # sum_v p_v^2 = exp(logsumexp(2 l) - 2 logsumexp(l))  (verl calculate_sum_pi_squared_from_logits)
        sum_squares = torch.exp(torch.logsumexp(2.0 * chunk, dim=-1) - 2.0 * log_z)
        return 1.0 - 2.0 * chosen.exp() + sum_squares

    return _by_row_chunks(energy, logits, token_ids)


@torch.no_grad()
def token_entropy_from_logits(logits: Tensor, token_ids: Tensor | None = None, temperature: float = 1.0) -> Tensor:
    """The entropy of ``softmax(logits / temperature)`` per position (nats), without autograd, in row chunks that bound
    its ``[.., V]`` temporaries (RENT's confidence, negated). ``token_ids`` is not read (the signature of
    `Policy.logit_statistics`' statistics)."""

    def entropy(chunk: Tensor) -> Tensor:
        chunk = _scaled(chunk, temperature)
        return _entropy(chunk, torch.logsumexp(chunk, dim=-1))

    return _by_row_chunks(entropy, logits)


@torch.no_grad()
def self_certainty_from_logits(logits: Tensor, token_ids: Tensor | None = None, temperature: float = 1.0) -> Tensor:
    """``KL(U || p) = logsumexp(l) - mean_v l_v - log V`` per position, ``p = softmax(l)``, ``l = logits /
    temperature``, ``U`` uniform over the ``V`` tokens: 0 for a uniform distribution, growing as ``p`` concentrates
    (INTUITOR's self-certainty). ``token_ids`` is not read (the signature of `Policy.logit_statistics`' statistics).
    In row chunks that bound its ``[.., V]`` temporaries."""

    def certainty(chunk: Tensor) -> Tensor:
        chunk = _scaled(chunk, temperature)
        # KL(U || p) = -log V - (1/V) sum_v log p_v = logsumexp(l) - mean(l) - log V  (Zhao et al. 2025,
        # arXiv:2505.19590 eq. 4; sunblaze-ucb/Intuitor self_certainty_from_logits, which omits the constant log V)
        return torch.logsumexp(chunk, dim=-1) - chunk.mean(dim=-1) - math.log(chunk.shape[-1])

    return _by_row_chunks(certainty, logits)


#: bytes the backward's per-chunk temporaries may take on a GPU: the `[rows, V]` float32 logit gradient, and its
#: copy in the forward's GEMM dtype when that is lower (bf16 under autocast); each chunk rewrites the whole
#: `[V, H]` weight gradient, so on a GPU few large chunks pay
BACKWARD_CHUNK_BYTES = 1 << 30
#: on a CPU: 16 MiB (2^22 float32 logits), where memory is the scarcer resource and larger chunks gain nothing
CPU_BACKWARD_CHUNK_BYTES = 1 << 24


def backward_chunk_rows(vocab: int, gemm_dtype: torch.dtype, chunk_bytes: int) -> int:
    """Rows of `[rows, vocab]` logits whose backward temporaries fit `chunk_bytes` (at least one row)."""
    per_row = vocab * (4 + (gemm_dtype.itemsize if gemm_dtype != torch.float32 else 0))
    return max(1, chunk_bytes // max(1, per_row))


class _LinearLogProbs(torch.autograd.Function):
    """`token_log_probs_from_logits(F.linear(hidden, weight, bias), ids, temperature)` for `[N, H]` hidden states,
    with the same forward values; the backward runs over row chunks of the kept logits sized by
    `BACKWARD_CHUNK_BYTES`, so that the `[N, V]` softmax and logit gradients are never whole (they are, under
    autograd: two to three logit-sized temporaries on top of the logits, at the peak of the update). Its GEMMs run
    in the forward's GEMM dtype: under autocast the autocast dtype (as autograd's would), else the weight's."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, token_ids, temperature, chunk_bytes):
        raw = F.linear(hidden, weight, bias)  # under autocast: in its dtype
        logits = _scaled(raw, temperature)
        log_z = torch.logsumexp(logits, dim=-1)
        chosen = torch.gather(logits, dim=-1, index=token_ids.long().unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(hidden, weight, logits, log_z, token_ids)
        ctx.temperature, ctx.has_bias, ctx.gemm_dtype, ctx.chunk_bytes = (
            temperature, bias is not None, raw.dtype, chunk_bytes
        )  # fmt: skip
        ctx.mark_non_differentiable(logits, log_z)
        return chosen - log_z, logits, log_z

    @staticmethod
    def backward(ctx, grad, _logits, _log_z):
        # the GEMMs' dtype is set by their casts: autocast (a backward run inside it) must not lower float32 ones
        with torch.autocast(grad.device.type, enabled=False):
            return _LinearLogProbs._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        hidden, weight, logits, log_z, token_ids = ctx.saved_tensors
        lowered = ctx.gemm_dtype != weight.dtype or ctx.gemm_dtype != hidden.dtype
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = logits.new_zeros(logits.shape[-1]) if ctx.has_bias and ctx.needs_input_grad[2] else None
        rows = backward_chunk_rows(logits.shape[-1], ctx.gemm_dtype if lowered else torch.float32, ctx.chunk_bytes)
        if lowered:  # autocast's casts, once per backward
            weight_gemm, hidden_gemm = weight.to(ctx.gemm_dtype), hidden.to(ctx.gemm_dtype)
        for start in range(0, logits.shape[0], rows):
            part = slice(start, start + rows)
            # d(l_y - logsumexp l)/dl = onehot(y) - softmax(l), scaled by 1/temperature
            grad_logits = torch.exp(logits[part] - log_z[part].unsqueeze(-1)).mul_(-grad[part].unsqueeze(-1))
            grad_logits.scatter_add_(-1, token_ids[part].long().unsqueeze(-1), grad[part].unsqueeze(-1))
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            grad_logits = grad_logits.to(ctx.gemm_dtype if lowered else weight.dtype)
            if grad_bias is not None:
                grad_bias += grad_logits.float().sum(0)
            if lowered:
                if grad_hidden is not None:
                    grad_hidden[part] = grad_logits @ weight_gemm
                if grad_weight is not None:
                    grad_weight += grad_logits.t().mm(hidden_gemm[part])
                continue
            if grad_hidden is not None:
                grad_hidden[part] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().float(), hidden[part].float())
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(weight.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_token_log_probs(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, token_ids: Tensor, temperature: float = 1.0,
    with_entropy: bool = False, chunk_bytes: int | None = None, float32: bool = False,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """Log-probs `[...]` of `token_ids` under the output layer `(weight, bias)` applied to `hidden` `[..., H]` at
    `temperature`, and the detached entropy of each position if asked: the values of
    `token_log_probs_and_entropy(F.linear(hidden, weight, bias), ...)`, with a backward that keeps only the
    logits (no logit-sized softmax or gradient temporaries; its temporaries take at most `chunk_bytes`, by
    default `CPU_BACKWARD_CHUNK_BYTES` on a CPU, `BACKWARD_CHUNK_BYTES` elsewhere). `float32`: the GEMMs of both
    passes in float32 whatever autocast or the operands' dtype say (a float32 output layer, `core/float32_head.py`;
    the gradients reach low-precision operands through the upcasts)."""
    shape = token_ids.shape
    if chunk_bytes is None:
        chunk_bytes = CPU_BACKWARD_CHUNK_BYTES if hidden.device.type == "cpu" else BACKWARD_CHUNK_BYTES
    precision = contextlib.nullcontext()
    if float32:
        hidden, weight, bias = hidden.float(), weight.float(), None if bias is None else bias.float()
        precision = torch.autocast(hidden.device.type, enabled=False)  # the forward's GEMM dtype: float32
    with precision:
        log_probs, logits, log_z = _LinearLogProbs.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, bias, token_ids.reshape(-1), temperature, chunk_bytes
        )
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = _by_row_chunks(_entropy, logits, log_z).reshape(shape)
    return log_probs.reshape(shape), entropy
