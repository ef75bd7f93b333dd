"""Residual add + RMSNorm: ``h = x + residual``; returns ``[rmsnorm(h) * w, h]``.

Shape ``rows x D`` (x, residual: rows x D; w: D). Built-in: the add then ``mx.fast.rms_norm``,
``mx.compile``d. The new residual is rounded to the dtype and the norm uses that rounded value,
as the built-in does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, normal
from ..render.dialect import float_literal
from ..render.launch import KernelSource
from ..spec import Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import rowwise

EPS = 1e-5

BODY = r"""
  const unsigned t = KF_TID % TPR;
  const KF_SIZE row = KF_SIZE(KF_GROUP) * RPG + KF_TID / TPR;
  const bool valid = row < KF_SIZE(x_shape[0]);
  KF_SHARED float red[32];
  float hv[NITER * V];
  float ss = 0.0f;
#pragma unroll
  for (int it = 0; it < NITER; ++it) {
    const unsigned j = it * TPR + t;
    if (valid && j < D / V) {
      kf_vec<T, V> a = kf_vload_h<V, H>(x + row * D, j);
      kf_vec<T, V> b = kf_vload_h<V, H>(res + row * D, j);
      kf_vec<T, V> h;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        h.v[k] = T(float(a.v[k]) + float(b.v[k]));
        hv[it * V + k] = float(h.v[k]);
        ss += hv[it * V + k] * hv[it * V + k];
      }
      kf_vstore_h<V, H>(new_res + row * D, j, h);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        hv[it * V + k] = 0.0f;
      }
    }
  }
""" + rowwise.rms_scale_store("hv")


def source(eps: float = EPS) -> KernelSource:
    return KernelSource("add_rmsnorm", BODY, ("x", "res", "w"), ("out", "new_res"),
                        (("EPS", float_literal(eps)),))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, eps: float = EPS) -> KernelFn:
    src = source(eps)

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        x, r, w = inputs
        return rowwise.run_rows(src, backend, config, dtype, [x, r], [w], ["row", "row"])

    return fn


def reference(inputs: Sequence[mx.array], eps: float = EPS) -> list[mx.array]:
    x, r, w = inputs
    h = (x.astype(mx.float32) + r.astype(mx.float32)).astype(x.dtype).astype(mx.float32)
    wf = w.astype(mx.float32)
    return [h * mx.rsqrt(mx.mean(h * h, axis=-1, keepdims=True) + eps) * wf, h]


def builtin(inputs: Sequence[mx.array], eps: float = EPS) -> list[mx.array]:
    x, r, w = inputs
    return list(_compiled(float(eps))(x, r, w))


@cache
def _compiled(eps: float) -> Callable[..., tuple[mx.array, mx.array]]:
    def f(x: mx.array, r: mx.array, w: mx.array) -> tuple[mx.array, mx.array]:
        h = x + r
        return mx.fast.rms_norm(h, w, eps), h

    return mx.compile(f)


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    rowwise.check_shape("add_rmsnorm", shape)
    return [normal(shape, dtype, seed, 0), normal(shape, dtype, seed, 1),
            normal(shape[-1:], dtype, seed, 2, scale=0.5, loc=1.0)]


SPEC = KernelSpec(
    name="add_rmsnorm",
    description="residual add + RMSNorm; returns [normed, new residual] (eps=1e-5)",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (4 * shape[0] * shape[1] + shape[1]) * ITEMSIZE[dtype],
    **rowwise.spec_fields("add_rmsnorm", __file__),
)
