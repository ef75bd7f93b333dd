"""log(sum(exp(x))) over the last dimension. Shape ``rows x D`` -> ``rows``.

Built-in: ``mx.logsumexp(x, axis=-1)``. One read of the row: max, then the sum of exponentials
from registers (``KF_EXP_FAST``: CUDA's ``__expf``, 2 % and 5 % faster than ``expf`` at
16384x8192 in two A/B runs on an H100); thread 0 of each row writes the result.
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
        s += KF_EXP_FAST(xv[it * V + k] - m);
      }
    }
  }
  s = kf_row_sum(s, red_b, KF_LANE, KF_WARP, TPR / 32);
  if (valid && t == 0) {
    out[row] = T(m + KF_LOG(s));
  }
"""

SOURCE = KernelSource("logsumexp", BODY, ("x",), ("out",))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        return rowwise.run_rows(SOURCE, backend, config, dtype, [inputs[0]], [], ["scalar"])

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    x = inputs[0].astype(mx.float32)
    m = mx.max(x, axis=-1, keepdims=True)
    return [(m + mx.log(mx.sum(mx.exp(x - m), axis=-1, keepdims=True))).squeeze(-1)]


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [mx.logsumexp(inputs[0], axis=-1)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    rowwise.check_shape("logsumexp", shape)
    return [normal(shape, dtype, seed, 0, scale=2.0)]


SPEC = KernelSpec(
    name="logsumexp",
    description="logsumexp over the last dim (one value per row)",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (shape[0] * shape[1] + shape[0]) * ITEMSIZE[dtype],
    **rowwise.spec_fields("logsumexp", __file__),
)
