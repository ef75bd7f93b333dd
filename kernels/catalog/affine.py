"""MLX's affine quantization format, as ``mx.quantize(w, group_size, bits)`` and
``mlx.nn.QuantizedLinear`` store it, and the pieces of it the catalog's kernels share.

For ``w`` of shape ``(N, K)``: ``w_q`` is uint32 ``(N, K * bits / 32)``, each word packing ``32 / bits``
consecutive values along K, lowest bits first (value ``j`` of a row is bits ``bits * (j % per)`` of
word ``j / per``); ``scales`` and ``biases`` are ``(N, K / group_size)`` in the activation dtype, and
``w[n, k] ~= scales[n, k / g] * code + biases[n, k / g]`` (``mlx/backend/metal/kernels/quantized.h``,
``affine_quantize``). Bits 4 and 8 and group sizes 32, 64 and 128 are the forms mlx-lm writes.

:data:`DEQUANT_BODY` is the dialect body of the dequantize kernel: elementwise geometry over packed
words, ``V`` words per step (all inside one group), template ints ``WORDS`` (words per row), ``BITS``,
``GS`` (group size), ``TG`` and ``IPT`` (vectors per thread).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..common import ITEMSIZE, ceil_div, flat_rows, mx_dtype, rng, shapes_only_on
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, Config, GpuBackend, Tolerance
from . import elementwise

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)

DEQUANT_BODY = r"""
  const KF_SIZE nvec = KF_SIZE(wq_shape[0]) * (WORDS / V);
  const KF_SIZE base = KF_SIZE(KF_GROUP) * (TG * IPT) + KF_TID;
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      const KF_SIZE word0 = i * V;
      const KF_SIZE r = word0 / WORDS;
      const KF_SIZE g = r * (WORDS / (GS * BITS / 32)) + (word0 % WORDS) / (GS * BITS / 32);
      const float sc = float(scales[g]);
      const float bi = float(biases[g]);
      kf_vec<uint32_t, V> q = kf_vload<V>(wq, i);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const uint32_t wd = q.v[k];
        kf_vec<T, 32 / BITS> o;
#pragma unroll
        for (int b = 0; b < 32 / BITS; ++b) {
          o.v[b] = T(sc * float((wd >> (BITS * b)) & ((1u << BITS) - 1u)) + bi);
        }
        kf_vstore<32 / BITS>(out, word0 + k, o);
      }
    }
  }
"""

# Tolerances of matmuls over weights in this format (quantized_matmul, gather_quantized_matmul).
# Outputs are near unit scale (make_inputs). float32: MLX's CUDA op at M=12 was off by 0.0024 (H100,
# MLX 0.32.4; every config of ours within 1e-3). float16/bfloat16: the dq path rounds each weight to the
# dtype before the GEMM (max abs error 0.02 at K=4096 in bfloat16), and MLX's CPU op accumulates in
# the activation dtype (measured on MLX 0.32.4: 0.085 at K=256 in bfloat16, 0.015 in float16; 0.5 and
# 0.09 at K=4096, which these tolerances reject)
MATMUL_TOLERANCES = {"float32": Tolerance(atol=5e-3, rtol=5e-3), "float16": Tolerance(atol=2e-2, rtol=4e-3),
                     "bfloat16": Tolerance(atol=1e-1, rtol=2e-2)}

DEQUANT = KernelSource("affine_dequantize", DEQUANT_BODY, ("wq", "scales", "biases"), ("out",))
VECS = (1, 2, 4, 8)


def check_format(name: str, cols: int, bits: int, group_size: int) -> None:
    if bits not in BITS:
        raise BadShape(f"{name}: bits must be one of {', '.join(map(str, BITS))}, got {bits}")
    if group_size not in GROUP_SIZES:
        sizes = ", ".join(map(str, GROUP_SIZES))
        raise BadShape(f"{name}: group size must be one of {sizes}, got {group_size}")
    if cols % group_size:
        raise BadShape(f"{name}: the quantized dimension ({cols}) must be a multiple of the group size "
                       f"{group_size}")


def dequant_space(cols: int, bits: int, group_size: int) -> list[Config]:
    """Configs of the dequantize kernel for rows of ``cols`` values: a step of ``vec`` words stays
    inside one group."""
    words_per_group = group_size * bits // 32
    return [{"tg": tg, "vec": vec, "ipt": ipt} for vec in VECS for tg in elementwise.TGS
            for ipt in elementwise.IPTS if words_per_group % vec == 0]


def dequantize(config: Config, backend: GpuBackend, wq: mx.array, scales: mx.array, biases: mx.array,
               bits: int, group_size: int) -> mx.array:
    """Launch the dequantize kernel: ``(rows, cols)`` values in ``scales``' dtype."""
    words = int(wq.shape[-1])
    cols = words * 32 // bits
    tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])
    wq2 = flat_rows(wq, words)
    rows = int(wq2.shape[0])
    groups = max(1, ceil_div(rows * words // vec, tg * ipt))
    template = (("T", scales.dtype), ("WORDS", words), ("BITS", bits), ("GS", group_size), ("V", vec),
                ("TG", tg), ("IPT", ipt))
    launch = Launch((groups * tg, 1, 1), (tg, 1, 1), template)
    groups_in = [flat_rows(scales, scales.shape[-1]), flat_rows(biases, biases.shape[-1])]
    (out,) = run(DEQUANT, backend, [wq2, *groups_in], launch, [(rows, cols)], [scales.dtype])
    return out


def reference_dequantize(wq: mx.array, scales: mx.array, biases: mx.array, bits: int,
                         group_size: int) -> mx.array:
    """The float32 weights ``(rows, cols)``, unpacked with plain MLX ops."""
    rows, words = int(wq.shape[0]), int(wq.shape[1])
    shifts = mx.array(np.arange(0, 32, bits, dtype=np.uint32))
    codes = ((wq[..., None] >> shifts) & ((1 << bits) - 1)).astype(mx.float32)
    codes = codes.reshape(rows, -1, group_size)
    out = codes * scales.astype(mx.float32)[..., None] + biases.astype(mx.float32)[..., None]
    return out.reshape(rows, words * 32 // bits)


def random_weights(rows: int, cols: int, bits: int, group_size: int, dtype: str, seed: int,
                   salt: int = 0) -> list[mx.array]:
    """``[w_q, scales, biases]``: random codes with per-group scales and biases as a quantized
    normal weight of std ``1/sqrt(cols)`` would have (so ``x @ w.T`` of a unit-normal ``x`` stays near
    unit scale). Drawn with numpy, deterministic in ``seed``."""
    dt = mx_dtype(dtype)
    if shapes_only_on():
        groups = (rows, cols // group_size)
        return [mx.zeros((rows, cols * bits // 32), dtype=mx.uint32), mx.zeros(groups, dtype=dt),
                mx.zeros(groups, dtype=dt)]
    g = rng(seed, salt)
    levels = (1 << bits) - 1
    # uniform codes: uniform random words
    wq = g.integers(0, 2**32, size=(rows, cols * bits // 32), dtype=np.uint64).astype(np.uint32)
    spread = 6.0 / np.sqrt(cols)  # the range a group of a normal weight spans
    scales = (spread / levels * (0.5 + g.random((rows, cols // group_size)))).astype(np.float32)
    biases = (-0.5 * levels * scales
              + 0.1 / np.sqrt(cols) * g.standard_normal((rows, cols // group_size))).astype(np.float32)
    return [mx.array(wq), mx.array(scales).astype(dt), mx.array(biases).astype(dt)]


def weight_bytes(rows: int, cols: int, bits: int, group_size: int, dtype: str) -> int:
    """Packed weights plus scales and biases."""
    return rows * cols * bits // 8 + 2 * rows * (cols // group_size) * ITEMSIZE[dtype]

