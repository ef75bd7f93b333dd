"""int4 dequantization in MLX's affine layout (``mx.quantize(w, group_size=64, bits=4)``).

Shape ``rows x cols`` of the full matrix. Inputs: ``wq`` (rows x cols/8 uint32; element ``j``
is bits ``4*(j%8)..`` of word ``j/8``), ``scales`` and ``biases`` (rows x cols/64, the output
dtype). ``out[r, j] = scales[r, j/64] * code + biases[r, j/64]``. Built-in: ``mx.dequantize``.

Kernel: elementwise geometry over packed words; ``vec`` words (8 outputs each) per step, all
inside one group of 64 (``8 % vec == 0``).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from . import elementwise
from .common import DTYPES, ITEMSIZE, TOLERANCES, ceil_div, flat_rows, mx_dtype, need_rank, rng
from .dialect import source_version
from .launch import KernelSource, Launch, run
from .spec import BadShape, Config, GpuBackend, KernelFn, KernelSpec, Shape

GROUP = 64
BITS = 4

BODY = r"""
  const KF_SIZE nvec = KF_SIZE(wq_shape[0]) * (WORDS / V);
  const KF_SIZE base = KF_SIZE(KF_GROUP) * (TG * IPT) + KF_TID;
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      const KF_SIZE word0 = i * V;
      const KF_SIZE r = word0 / WORDS;
      const KF_SIZE g = r * (WORDS / 8) + (word0 % WORDS) / 8;
      const float sc = float(scales[g]);
      const float bi = float(biases[g]);
      kf_vec<uint32_t, V> q = kf_vload<V>(wq, i);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const uint32_t wd = q.v[k];
        kf_vec<T, 8> o;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          o.v[b] = T(sc * float((wd >> (4 * b)) & 15u) + bi);
        }
        kf_vstore<8>(out, word0 + k, o);
      }
    }
  }
"""

SOURCE = KernelSource("int4_dequantize", BODY, ("wq", "scales", "biases"), ("out",))
VECS = (1, 2, 4, 8)


def space(shape: Shape, dtype: str) -> list[Config]:
    words = shape[-1] // 8
    return [c for vec in VECS for tg in elementwise.TGS for ipt in elementwise.IPTS
            if words % vec == 0 and (c := {"tg": tg, "vec": vec, "ipt": ipt})]


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    cols = shape[-1]
    words = cols // 8
    tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        wq, sc, bi = inputs
        lead = tuple(wq.shape[:-1])
        wq2 = flat_rows(wq, words)
        rows = int(wq2.shape[0])
        groups = max(1, ceil_div(rows * words // vec, tg * ipt))
        template = (("T", mx_dtype(dtype)), ("WORDS", words), ("V", vec), ("TG", tg), ("IPT", ipt))
        launch = Launch((groups * tg, 1, 1), (tg, 1, 1), template)
        (out,) = run(SOURCE, backend, [wq2, flat_rows(sc, sc.shape[-1]), flat_rows(bi, bi.shape[-1])], launch,
                     [(rows, cols)], [sc.dtype])
        return [out.reshape(*lead, cols)]

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    wq, sc, bi = inputs
    rows, words = int(wq.shape[0]), int(wq.shape[1])
    shifts = mx.array(np.arange(0, 32, BITS, dtype=np.uint32))
    codes = ((wq[..., None] >> shifts) & 15).astype(mx.float32).reshape(rows, -1, GROUP)
    out = codes * sc.astype(mx.float32)[..., None] + bi.astype(mx.float32)[..., None]
    return [out.reshape(rows, words * 8)]


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    wq, sc, bi = inputs
    return [mx.dequantize(wq, sc, bi, group_size=GROUP, bits=BITS)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    """Packed random codes with per-group scales (~0.02) and biases (~ -8 * scale), as a quantized
    normal weight would have."""
    _check(shape)
    rows, cols = shape
    g = rng(seed, 0)
    wq = g.integers(0, 2**32, size=(rows, cols // 8), dtype=np.uint64).astype(np.uint32)
    scales = (0.01 + 0.02 * g.random((rows, cols // GROUP))).astype(np.float32)
    biases = (-8.0 * scales + 0.01 * g.standard_normal((rows, cols // GROUP))).astype(np.float32)
    dt = mx_dtype(dtype)
    return [mx.array(wq), mx.array(scales).astype(dt), mx.array(biases).astype(dt)]


def _check(shape: Shape) -> None:
    need_rank("int4_dequantize", shape, 2, "rows x cols")
    if shape[-1] % GROUP:
        raise BadShape(f"int4_dequantize: cols must be a multiple of {GROUP}, got {shape[-1]}")


SPEC = KernelSpec(
    name="int4_dequantize",
    description="MLX affine int4 dequantization, group size 64",
    dtypes=DTYPES,
    shape_doc="rows x cols",
    shapes={"decode": [(1, 4096), (32, 4096)], "large": [(8192, 8192), (14336, 4096)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=space,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (shape[0] * shape[1] // 2
                                      + 2 * shape[0] * shape[1] // GROUP * ITEMSIZE[dtype]
                                      + shape[0] * shape[1] * ITEMSIZE[dtype]),
    version=source_version(__file__, elementwise.__file__),
    validate_shape=_check,
    test_shapes=[(7, 192)],
    # one word per thread measured fastest on an H200 (wider steps store 64+ outputs per thread)
    default=lambda shape, dtype: {"tg": 256, "vec": 1, "ipt": 1},
)
