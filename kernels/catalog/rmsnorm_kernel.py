"""RMSNorm over the last dimension: ``out = x * rsqrt(mean(x^2) + eps) * w``.

Shape ``rows x D`` (x is rows x D, w is D). Built-in: ``mx.fast.rms_norm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, normal
from ..render.dialect import float_literal
from ..render.launch import KernelSource
from ..spec import Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import rowwise

EPS = 1e-5

BODY = rowwise.LOAD_ROW + r"""
  KF_SHARED float red[32];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < NITER * V; ++i) {
    ss += xv[i] * xv[i];
  }
""" + rowwise.rms_scale_store("xv")


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
    rowwise.check_shape("rmsnorm", shape)
    return [normal(shape, dtype, seed, 0), normal(shape[-1:], dtype, seed, 1, scale=0.5, loc=1.0)]


SPEC = KernelSpec(
    name="rmsnorm",
    description="RMSNorm over the last dim with a weight vector (eps=1e-5)",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (2 * shape[0] * shape[1] + shape[1]) * ITEMSIZE[dtype],
    **rowwise.spec_fields("rmsnorm", __file__),
)
