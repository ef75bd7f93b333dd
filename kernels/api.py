"""One public function per catalog kernel: ``from kernelfleet.kernels import rmsnorm``.

Each runs the config chosen for this chip (profile entry, else the kernel's default) through
:func:`kernelfleet.kernels.patch.runtime.dispatch`; on CPU it runs the MLX built-in.
"""

from __future__ import annotations

import mlx.core as mx

from .common import prod
from .patch.runtime import dispatch


def _rows(x: mx.array) -> tuple[int, int]:
    return (prod(x.shape[:-1]), int(x.shape[-1]))


def rmsnorm(x: mx.array, weight: mx.array, eps: float = 1e-5) -> mx.array:
    return dispatch("rmsnorm", [x, weight], _rows(x), eps=float(eps))[0]


def add_rmsnorm(x: mx.array, residual: mx.array, weight: mx.array,
                eps: float = 1e-5) -> tuple[mx.array, mx.array]:
    """``h = x + residual``; returns ``(rmsnorm(h) * weight, h)``."""
    out, h = dispatch("add_rmsnorm", [x, residual, weight], _rows(x), eps=float(eps))
    return out, h


def layernorm(x: mx.array, weight: mx.array, bias: mx.array, eps: float = 1e-5) -> mx.array:
    return dispatch("layernorm", [x, weight, bias], _rows(x), eps=float(eps))[0]


def softmax(x: mx.array) -> mx.array:
    """Softmax over the last dimension."""
    return dispatch("softmax", [x], _rows(x))[0]


def logsumexp(x: mx.array) -> mx.array:
    """log(sum(exp(x))) over the last dimension."""
    return dispatch("logsumexp", [x], _rows(x))[0]


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """``silu(gate) * up``."""
    return dispatch("swiglu", [gate, up], _rows(gate))[0]


def geglu(gate: mx.array, up: mx.array) -> mx.array:
    """``gelu_tanh(gate) * up``."""
    return dispatch("geglu", [gate, up], _rows(gate))[0]


def bias_gelu(x: mx.array, bias: mx.array) -> mx.array:
    """``gelu(x + bias)`` (erf form)."""
    return dispatch("bias_gelu", [x, bias], _rows(x))[0]


def rope(x: mx.array, offset: int | mx.array = 0, base: float = 10000.0) -> mx.array:
    """Rotary embedding of the whole last dim (non-traditional, half split); positions along axis -2
    start at ``offset`` (an int or a scalar int array). Profiles measure rope on the view attention
    layers hold (``(B, heads, L, Dh)`` over ``(B, L, heads, Dh)``); ``x`` of any layout takes the same
    entry, read row-contiguous (a copy where it is not)."""
    shape = (prod(x.shape[:-2]), int(x.shape[-2]), int(x.shape[-1]))
    if isinstance(offset, mx.array):
        off = offset.astype(mx.int32).reshape(1)
    else:
        off = mx.array([int(offset)], mx.int32)
    return dispatch("rope", [x, off], shape, base=float(base))[0]


def topk_gating_softmax(logits: mx.array, k: int = 2) -> tuple[mx.array, mx.array]:
    """Softmax over experts (last dim), then the top ``k``: (weights, uint32 indices), largest first."""
    w, idx = dispatch("topk_gating_softmax", [logits], _rows(logits), k=int(k))
    return w, idx


def moe_combine(expert_outputs: mx.array, weights: mx.array) -> mx.array:
    """``sum_k weights[..., k] * expert_outputs[..., k, :]``."""
    shape = (prod(expert_outputs.shape[:-2]), int(expert_outputs.shape[-2]), int(expert_outputs.shape[-1]))
    return dispatch("moe_combine", [expert_outputs, weights], shape)[0]


def int4_dequantize(wq: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
    """MLX affine 4-bit dequantization, group size 64 (the layout of ``mx.quantize``)."""
    shape = (prod(wq.shape[:-1]), int(wq.shape[-1]) * 8)
    return dispatch("int4_dequantize", [wq, scales, biases], shape, dtype_of=1)[0]


def quantized_matmul(x: mx.array, w_q: mx.array, scales: mx.array, biases: mx.array,
                     group_size: int = 64, bits: int = 4) -> mx.array:
    """``x @ w.T`` for ``w`` in MLX's affine format (``mx.quantize(w, group_size, bits)``; what
    ``mlx.nn.QuantizedLinear`` stores), over ``x``'s last dimension: as ``mx.quantized_matmul(x, w_q,
    scales, biases, transpose=True, group_size=group_size, bits=bits)``."""
    k = int(x.shape[-1])
    rows = x.size // k
    shape = (rows, k, int(w_q.shape[0]), int(bits), int(group_size))
    out = dispatch("quantized_matmul", [x.reshape(rows, k), w_q, scales, biases], shape)[0]
    return out.reshape(*x.shape[:-1], shape[2])


def gather_quantized_matmul(x: mx.array, w_q: mx.array, scales: mx.array, biases: mx.array,
                            indices: mx.array, group_size: int = 64, bits: int = 4) -> mx.array:
    """``out[t] = x[t] @ w[indices[t]].T`` for ``T`` (token, expert) pairs sorted by expert: ``x`` ``(T, K)``,
    ``w_q`` / ``scales`` / ``biases`` of ``E`` experts in MLX's affine format, ``indices`` ``(T,)``; as
    ``mx.gather_qmm(x[:, None], w_q, scales, biases, rhs_indices=indices, transpose=True,
    sorted_indices=True)``."""
    t, k = int(x.shape[0]), int(x.shape[-1])
    shape = (t, k, int(w_q.shape[1]), int(w_q.shape[0]), int(bits), int(group_size))
    return dispatch("gather_quantized_matmul", [x, w_q, scales, biases, indices], shape)[0]
