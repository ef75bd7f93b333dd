"""Rotary position embedding (non-traditional / half-split, whole head dim rotated).

Shape ``H x L x Dh`` (H = batch * heads, L positions, head dim Dh, default 128). Inputs:
``x`` and a 1-element int32 ``offset`` (the position of the first row; an array so decoding does
not recompile per step). ``x`` comes as attention layers hold it and hand it to ``nn.RoPE``: the
``(H, L, Dh)`` view of an ``(L, H, Dh)`` projection (mlx-lm's ``reshape(B, L, heads, -1).transpose(0,
2, 1, 3)``). The catalog measures rope in that layout, so a profile's choice holds where models
call it: there ``mx.fast.rope`` reads the view in place and attention reads its output fastest as
the view, while in a row-contiguous layout MLX's rope ran 2.2-2.9x slower than ours on an H100
(``benchmarks/results/h100_frontier.txt``; see ``make`` for the attention layout's figures).

For position ``p = l + offset`` and pair ``i < Dh/2``:
``theta = p * base^(-2i/Dh)``; ``out[i] = x[i] cos - x[i + Dh/2] sin``,
``out[i + Dh/2] = x[i + Dh/2] cos + x[i] sin``. Built-in: ``mx.fast.rope``.

Angles are float32 on every path (built-in included), so float32 results carry an absolute error
of about ``p * 1e-7``; the float32 tolerance allows for positions up to a few thousand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..common import DTYPES, ITEMSIZE, TOLERANCES, ceil_div, flat_rows, mx_dtype, need_rank, normal
from ..render.dialect import float_literal, source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, Config, GpuBackend, KernelFn, KernelSpec, Shape, Tolerance
from . import elementwise

BASE = 10000.0
TEST_OFFSET = 5

# x is (A, L, G, Dh), row-contiguous, positions on axis 1: (heads, L, 1, Dh) for the catalog's
# shape, (batch, L, heads, Dh) for the layout models hold (see ``make``). Vector i covers pairs
# [pv*V, pv*V+V) of row r = i / (HALF/V); the row's position is (r / G) % L.
BODY = r"""
  const KF_SIZE group = KF_SIZE(x_shape[2]);
  const KF_SIZE seq = KF_SIZE(x_shape[1]);
  const KF_SIZE nvec = KF_SIZE(x_shape[0]) * seq * group * (HALF / V);
  const KF_SIZE base = KF_SIZE(KF_GROUP) * (TG * IPT) + KF_TID;
  const float pos0 = float(off[0]);
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      const KF_SIZE r = i / (HALF / V);
      const unsigned pv = unsigned(i % (HALF / V));
      const float p = pos0 + float((r / group) % seq);
      const KF_SIZE lo = r * (2 * HALF) / V + pv;
      kf_vec<T, V> a = kf_vload<V>(x, lo);
      kf_vec<T, V> b = kf_vload<V>(x, lo + HALF / V);
      kf_vec<T, V> oa;
      kf_vec<T, V> ob;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float inv_freq = KF_EXP(float(pv * V + k) * ${NEG_LOG_BASE_OVER_HALF});
        const float theta = p * inv_freq;
        float sn;
        float c;
        KF_SINCOS(theta, &sn, &c);
        const float xa = float(a.v[k]);
        const float xb = float(b.v[k]);
        oa.v[k] = T(xa * c - xb * sn);
        ob.v[k] = T(xb * c + xa * sn);
      }
      kf_vstore<V>(out, lo, oa);
      kf_vstore<V>(out, lo + HALF / V, ob);
    }
  }
"""


def source(half: int, base: float = BASE) -> KernelSource:
    return KernelSource("rope", BODY, ("x", "off"), ("out",),
                        (("NEG_LOG_BASE_OVER_HALF", float_literal(-math.log(base) / half)),))


def space(shape: Shape, dtype: str) -> list[Config]:
    half = shape[-1] // 2
    return elementwise.space(half, dtype)


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, base: float = BASE,
         heads_inner: bool = False) -> KernelFn:
    """``heads_inner``: ``x`` is ``([batch,] heads, L, Dh)`` as an attention layer holds it, the
    transpose of a row-contiguous ``([batch,] L, heads, Dh)`` projection; the kernel reads and writes
    that layout (no copy to make ``x`` row-contiguous) and hands back the same transposed view, the
    layout ``mx.fast.rope`` hands back and the attention kernel reads fastest. (H100, Llama-3-8B
    prefill of 2048 tokens: rope of q from a copy 44 us against mx.fast.rope's 31 us; attention
    with a row-contiguous q 121 us against 83 us with the view.)"""
    Dh = shape[-1]
    half = Dh // 2
    src = source(half, base)
    tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        x, off = inputs
        lead = tuple(x.shape)
        if heads_inner:
            if x.ndim < 3:
                raise BadShape(f"rope: heads_inner takes ([batch,] heads, L, head_dim), got {lead}")
            held = x.swapaxes(-3, -2)  # (..., L, heads, Dh): row-contiguous for attention's view
            x4 = flat_rows(held, *held.shape[-3:])
        else:
            x4 = flat_rows(x, x.shape[-2], 1, Dh)
        nvec = x4.size // (2 * vec)
        groups = max(1, ceil_div(nvec, tg * ipt))
        template = (("T", mx_dtype(dtype)), ("HALF", half), ("V", vec), ("TG", tg), ("IPT", ipt))
        launch = Launch((groups * tg, 1, 1), (tg, 1, 1), template)
        (out,) = run(src, backend, [x4, off.astype(mx.int32).reshape(1)], launch, [x4.shape], [x.dtype])
        return [out.reshape(held.shape).swapaxes(-3, -2) if heads_inner else out.reshape(lead)]

    return fn


def reference(inputs: Sequence[mx.array], base: float = BASE) -> list[mx.array]:
    x, off = inputs
    L, Dh = int(x.shape[-2]), int(x.shape[-1])
    pos = np.arange(L, dtype=np.float64) + float(np.asarray(off).reshape(-1)[0])
    theta = pos[:, None] * base ** (-np.arange(Dh // 2, dtype=np.float64) * 2.0 / Dh)[None, :]
    c = mx.array(np.cos(theta).astype(np.float32))
    s = mx.array(np.sin(theta).astype(np.float32))
    xf = x.astype(mx.float32)
    x1, x2 = xf[..., : Dh // 2], xf[..., Dh // 2:]
    return [mx.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)]


def builtin(inputs: Sequence[mx.array], base: float = BASE, heads_inner: bool = False) -> list[mx.array]:
    # heads_inner: a layout only (the values do not depend on it); mx.fast.rope reads the view as it is
    x, off = inputs
    return [mx.fast.rope(x, int(x.shape[-1]), traditional=False, base=base, scale=1.0,
                         offset=off.reshape(()).astype(mx.int32))]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    """``x`` exactly as attention holds it (see the module docstring): the (1, heads, L, Dh) view of
    a (1, L, heads, Dh) array. The 4-D view matters: tuned on an H100 at 32x2048x128, ours was 1.22x
    MLX's rope on it and 1.93x on a 3-D view of the same memory, where MLX's rope is slower."""
    _check(shape)
    heads, seq, dh = shape
    held = normal((1, seq, heads, dh), dtype, seed, 0)
    return [held.transpose(0, 2, 1, 3), mx.array([TEST_OFFSET], dtype=mx.int32)]


def build(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    """The catalog's (and so the tuner's) build: the attention layout, as ``make_inputs`` makes it."""
    return make(config, backend, shape, dtype, heads_inner=True)


def _check(shape: Shape) -> None:
    need_rank("rope", shape, 3, "heads x positions x head_dim")
    if shape[-1] % 2 or shape[-1] < 16:
        raise BadShape(f"rope: head dim must be even and >= 16, got {shape[-1]}")


TOLS = dict(TOLERANCES)
TOLS["float32"] = Tolerance(atol=1e-3, rtol=1e-3)
# A rotation output is a difference of two products of the inputs: where it nearly cancels, its
# rounding error follows |x|, not |out|. MLX's CPU rope keeps bfloat16 intermediates: on
# 512x2048x128 normal inputs (|x| up to ~6) it is off by up to 0.038 (about one bfloat16 ulp at that
# magnitude) at 5 of 134M values. atol = one ulp for |x| in [8, 16) covers it.
TOLS["bfloat16"] = Tolerance(atol=6.25e-2, rtol=2e-2)

SPEC = KernelSpec(
    name="rope",
    description="rotary embedding, half-split, base 10000, whole head dim (offset input)",
    dtypes=DTYPES,
    shape_doc="heads x positions x head_dim",
    shapes={"decode": [(32, 1, 128), (32, 32, 128)], "large": [(512, 2048, 128), (32, 4096, 128)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=space,
    build=build,
    tolerances=TOLS,
    bytes_moved=lambda shape, dtype: 2 * shape[0] * shape[1] * shape[2] * ITEMSIZE[dtype],
    version=source_version(__file__, elementwise.__file__),
    validate_shape=_check,
    test_shapes=[(6, 37, 128)],
    default=lambda shape, dtype: elementwise.default_config(shape[-1] // 2, dtype),
)
