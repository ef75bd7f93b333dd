"""GeGLU activation (tanh GELU): ``gelu_tanh(gate) * up``. Shape ``rows x D`` (gate and up both rows x D).

Built-in: the composition ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up``, ``mx.compile``d.
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
        const float y = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        o.v[k] = T(0.5f * x * (1.0f + KF_TANH(y)) * float(u.v[k]));
      }
      kf_vstore<V>(out, i, o);
    }
  }
"""

SOURCE = KernelSource("geglu", BODY, ("a", "b"), ("out",))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        return elementwise.run_elementwise(SOURCE, backend, config, dtype, list(inputs), [])

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    g, u = (a.astype(mx.float32) for a in inputs)
    return [_gelu_tanh(g) * u]


def _gelu_tanh(g: mx.array) -> mx.array:
    return 0.5 * g * (1.0 + mx.tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))


@mx.compile
def _geglu(g: mx.array, u: mx.array) -> mx.array:
    return _gelu_tanh(g) * u


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [_geglu(inputs[0], inputs[1])]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    elementwise.check_shape("geglu", shape)
    return [normal(shape, dtype, seed, 0, scale=2.0), normal(shape, dtype, seed, 1)]


SPEC = KernelSpec(
    name="geglu",
    description="gelu_tanh(gate) * up",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: 3 * shape[0] * shape[1] * ITEMSIZE[dtype],
    **elementwise.spec_fields("geglu", __file__, decode_cols=14336),
)
