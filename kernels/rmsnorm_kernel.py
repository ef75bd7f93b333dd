"""RMSNorm over the last dimension: ``out = x * rsqrt(mean(x^2) + eps) * w``.

Shape ``rows x D`` (x is rows x D, w is D). Built-in: ``mx.fast.rms_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from . import rowwise
from .common import DTYPES, ITEMSIZE, TOLERANCES, need_rank, normal
from .dialect import float_literal, source_version
from .launch import KernelSource
from .spec import Config, GpuBackend, KernelFn, KernelSpec, Shape

EPS = 1e-5

BODY = rowwise.LOAD_ROW + r"""
  KF_SHARED float red[32];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < NITER * V; ++i) {
    ss += xv[i] * xv[i];
  }
  ss = kf_row_sum(ss, red, KF_LANE, KF_WARP, TPR / 32);
  const float inv = KF_RSQRT(ss / float(D) + ${EPS});
  if (valid) {
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      const unsigned j = it * TPR + t;
      if (j < D / V) {
        kf_vec<T, V> wv = kf_vload<V>(w, j);
        kf_vec<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          o.v[k] = T(xv[it * V + k] * inv * float(wv.v[k]));
        }
        kf_vstore<V>(out + row * D, j, o);
      }
    }
  }
"""


def source(eps: float = EPS) -> KernelSource:
    return KernelSource("rmsnorm", BODY, ("x", "w"), ("out",), (("EPS", float_literal(eps)),))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, eps: float = EPS) -> KernelFn:
    src = source(eps)

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        x, w = inputs
        return rowwise.run_rows(src, backend, config, dtype, [x], [w], ["row"])

    return fn


def reference(inputs: Sequence[mx.array], eps: float = EPS) -> list[mx.array]:
    x, w = (a.astype(mx.float32) for a in inputs)
    return [x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps) * w]


def builtin(inputs: Sequence[mx.array], eps: float = EPS) -> list[mx.array]:
    x, w = inputs
    return [mx.fast.rms_norm(x, w, eps)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    _check(shape)
    return [normal(shape, dtype, seed, 0), normal(shape[-1:], dtype, seed, 1, scale=0.5, loc=1.0)]


def _check(shape: Shape) -> None:
    need_rank("rmsnorm", shape, 2, "rows x D")
    rowwise.check_row(shape[-1], "float32")


SPEC = KernelSpec(
    name="rmsnorm",
    description="RMSNorm over the last dim with a weight vector (eps=1e-5)",
    dtypes=DTYPES,
    shape_doc="rows x D",
    shapes={"decode": [(1, 4096), (32, 4096)], "large": [(16384, 8192), (4096, 4096)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=lambda shape, dtype: rowwise.space(shape[-1], dtype),
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (2 * shape[0] * shape[1] + shape[1]) * ITEMSIZE[dtype],
    version=source_version(__file__, rowwise.__file__),
    validate_shape=_check,
    test_shapes=[(19, 1024)],
    default=lambda shape, dtype: rowwise.default_config(shape[-1], dtype),
)
