"""Bias add + GELU (erf form): ``y = x + bias; 0.5 y (1 + erf(y / sqrt 2))``.

Shape ``rows x D`` (x rows x D, bias D). Built-in: that composition, ``mx.compile``d.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, normal
from ..render.launch import KernelSource
from ..spec import Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import elementwise

BODY = elementwise.INDEX + r"""
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      kf_vec<T, V> xv = kf_vload<V>(a, i);
      kf_vec<T, V> bv = kf_vload<V>(bias, i % (D / V));
      kf_vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float y = float(xv.v[k]) + float(bv.v[k]);
        o.v[k] = T(0.5f * y * (1.0f + KF_ERF(y * 0.7071067811865476f)));
      }
      kf_vstore<V>(out, i, o);
    }
  }
"""

SOURCE = KernelSource("bias_gelu", BODY, ("a", "bias"), ("out",))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        x, b = inputs
        return elementwise.run_elementwise(SOURCE, backend, config, dtype, [x], [b])

    return fn


def _gelu(y: mx.array) -> mx.array:
    return 0.5 * y * (1.0 + mx.erf(y * 0.7071067811865476))


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    x, b = (a.astype(mx.float32) for a in inputs)
    return [_gelu(x + b)]


@mx.compile
def _bias_gelu(x: mx.array, b: mx.array) -> mx.array:
    return _gelu(x + b)


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [_bias_gelu(inputs[0], inputs[1])]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    elementwise.check_shape("bias_gelu", shape)
    return [normal(shape, dtype, seed, 0, scale=2.0), normal(shape[-1:], dtype, seed, 1, scale=0.5)]


SPEC = KernelSpec(
    name="bias_gelu",
    description="gelu(x + bias), erf form",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (2 * shape[0] * shape[1] + shape[1]) * ITEMSIZE[dtype],
    **elementwise.spec_fields("bias_gelu", __file__, decode_cols=4096),
)
