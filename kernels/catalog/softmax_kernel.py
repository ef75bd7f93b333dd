"""Softmax over the last dimension. Shape ``rows x D``. Built-in: ``mx.softmax(x, axis=-1, precise=True)``
(MLX's default accumulates half types in half and misses the tolerance).

The row stays in registers: max (warp shuffles + one exchange), exponentials, sum, scale.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, normal
from ..render.launch import KernelSource
from ..spec import Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import rowwise

BODY = rowwise.LOAD_ROW + rowwise.ROW_MAX + r"""
  float s = 0.0f;
#pragma unroll
  for (int it = 0; it < NITER; ++it) {
    if (it * TPR + t < D / V) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        xv[it * V + k] = KF_EXP_FAST(xv[it * V + k] - m);
        s += xv[it * V + k];
      }
    }
  }
  const float inv = 1.0f / kf_row_sum(s, red_b, KF_LANE, KF_WARP, TPR / 32);
  if (valid) {
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      const unsigned j = it * TPR + t;
      if (j < D / V) {
        kf_vec<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          o.v[k] = T(xv[it * V + k] * inv);
        }
        kf_vstore_h<V, H>(out + row * D, j, o);
      }
    }
  }
"""

SOURCE = KernelSource("softmax", BODY, ("x",), ("out",))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        return rowwise.run_rows(SOURCE, backend, config, dtype, [inputs[0]], [], ["row"])

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    x = inputs[0].astype(mx.float32)
    e = mx.exp(x - mx.max(x, axis=-1, keepdims=True))
    return [e / mx.sum(e, axis=-1, keepdims=True)]


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [mx.softmax(inputs[0], axis=-1, precise=True)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    rowwise.check_shape("softmax", shape)
    return [normal(shape, dtype, seed, 0, scale=2.0)]


SPEC = KernelSpec(
    name="softmax",
    description="softmax over the last dim",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: 2 * shape[0] * shape[1] * ITEMSIZE[dtype],
    **rowwise.spec_fields("softmax", __file__),
)
