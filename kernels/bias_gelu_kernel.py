"""Bias add + GELU (erf form): ``y = x + bias; 0.5 y (1 + erf(y / sqrt 2))``.

Shape ``rows x D`` (x rows x D, bias D). Built-in: that composition, ``mx.compile``d.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from . import elementwise
from .common import DTYPES, ITEMSIZE, TOLERANCES, need_rank, normal
from .dialect import source_version
from .launch import KernelSource
from .spec import Config, GpuBackend, KernelFn, KernelSpec, Shape

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
    _check(shape)
    return [normal(shape, dtype, seed, 0, scale=2.0), normal(shape[-1:], dtype, seed, 1, scale=0.5)]


def _check(shape: Shape) -> None:
    need_rank("bias_gelu", shape, 2, "rows x D")
    elementwise.check_cols(shape[-1])


SPEC = KernelSpec(
    name="bias_gelu",
    description="gelu(x + bias), erf form",
    dtypes=DTYPES,
    shape_doc="rows x D",
    shapes={"decode": [(1, 4096), (32, 4096)], "large": [(16384, 8192), (4096, 14336)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=lambda shape, dtype: elementwise.space(shape[-1], dtype),
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (2 * shape[0] * shape[1] + shape[1]) * ITEMSIZE[dtype],
    version=source_version(__file__, elementwise.__file__),
    validate_shape=_check,
    test_shapes=[(19, 1000)],
    default=lambda shape, dtype: elementwise.default_config(shape[-1], dtype),
)
