"""SwiGLU activation: ``silu(gate) * up``. Shape ``rows x D`` (gate and up both rows x D).

Built-in: the composition ``gate * sigmoid(gate) * up``, ``mx.compile``d.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from . import elementwise
from .common import ITEMSIZE, TOLERANCES, normal
from .launch import KernelSource
from .spec import Config, GpuBackend, KernelFn, KernelSpec, Shape

BODY = elementwise.INDEX + r"""
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      kf_vec<T, V> g = kf_vload<V>(a, i);
      kf_vec<T, V> u = kf_vload<V>(b, i);
      kf_vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float x = float(g.v[k]);
        o.v[k] = T(x / (1.0f + KF_EXP(-x)) * float(u.v[k]));
      }
      kf_vstore<V>(out, i, o);
    }
  }
"""

SOURCE = KernelSource("swiglu", BODY, ("a", "b"), ("out",))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        return elementwise.run_elementwise(SOURCE, backend, config, dtype, list(inputs), [])

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    g, u = (a.astype(mx.float32) for a in inputs)
    return [g * mx.sigmoid(g) * u]


@mx.compile
def _swiglu(g: mx.array, u: mx.array) -> mx.array:
    return g * mx.sigmoid(g) * u


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [_swiglu(inputs[0], inputs[1])]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    elementwise.check_shape("swiglu", shape)
    return [normal(shape, dtype, seed, 0, scale=2.0), normal(shape, dtype, seed, 1)]


SPEC = KernelSpec(
    name="swiglu",
    description="silu(gate) * up",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: 3 * shape[0] * shape[1] * ITEMSIZE[dtype],
    **elementwise.spec_fields("swiglu", __file__, decode_cols=14336),
)
