"""MoE combine: ``out[n, :] = sum_k weights[n, k] * expert_out[n, k, :]``.

Shape ``tokens x k x D`` (expert_out tokens x k x D, weights tokens x k, both the same dtype).
Built-in: ``(expert_out * weights[..., None]).sum(axis=-2)``, ``mx.compile``d. Elementwise
family geometry over the output's vectors; the k weights of a token are read per vector.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..common import DTYPES, ITEMSIZE, TOLERANCES, ceil_div, flat_rows, mx_dtype, need_rank, normal
from ..render.dialect import source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import elementwise

BODY = elementwise.INDEX + r"""
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      const KF_SIZE n = i / (D / V);
      const KF_SIZE dv = i % (D / V);
      float acc[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        acc[k] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < K; ++e) {
        const float g = float(w[n * K + e]);
        kf_vec<T, V> y = kf_vload_h<V, H>(a, (n * K + e) * (D / V) + dv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          acc[k] += g * float(y.v[k]);
        }
      }
      kf_vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        o.v[k] = T(acc[k]);
      }
      kf_vstore_h<V, H>(out, i, o);
    }
  }
"""

SOURCE = KernelSource("moe_combine", BODY, ("a", "w"), ("out",))
AXES = ("hint",)  # the expert outputs are read once: the cache-policy axis


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    K, D = shape[-2], shape[-1]
    tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        y, w = inputs
        lead = tuple(y.shape[:-2])
        y3 = flat_rows(y, K, D)
        tokens = int(y3.shape[0])
        groups = max(1, ceil_div(tokens * D // vec, tg * ipt))
        template = (("T", mx_dtype(dtype)), ("D", D), ("K", K), ("V", vec), ("TG", tg), ("IPT", ipt),
                    *elementwise.axis_template(config, AXES))
        launch = Launch((groups * tg, 1, 1), (tg, 1, 1), template)
        (out,) = run(SOURCE, backend, [y3, w.reshape(tokens, K)], launch, [(tokens, D)], [y.dtype])
        return [out.reshape(*lead, D)]

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    y, w = (a.astype(mx.float32) for a in inputs)
    return [mx.sum(y * w[..., None], axis=-2)]


@mx.compile
def _combine(y: mx.array, w: mx.array) -> mx.array:
    return mx.sum(y * w[..., None], axis=-2)


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [_combine(inputs[0], inputs[1])]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    _check(shape)
    tokens, k, _ = shape
    w = mx.softmax(normal((tokens, k), "float32", seed, 1), axis=-1).astype(mx_dtype(dtype))
    return [normal(shape, dtype, seed, 0), w]


def _check(shape: Shape) -> None:
    need_rank("moe_combine", shape, 3, "tokens x k x D")
    if shape[1] > 64:
        raise BadShape(f"moe_combine: at most 64 experts per token, got {shape[1]}")
    elementwise.check_cols(shape[-1])


SPEC = KernelSpec(
    name="moe_combine",
    description="weighted sum of the k expert outputs of each token",
    dtypes=DTYPES,
    shape_doc="tokens x k x D",
    shapes={"decode": [(1, 2, 4096), (32, 2, 4096)], "large": [(16384, 2, 4096), (4096, 8, 4096)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=lambda shape, dtype: elementwise.space(shape[-1], dtype, AXES),
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (shape[0] * shape[1] * shape[2] + shape[0] * shape[1]
                                      + shape[0] * shape[2]) * ITEMSIZE[dtype],
    version=source_version(__file__, elementwise.__file__),
    validate_shape=_check,
    test_shapes=[(7, 2, 1000)],
    default=lambda shape, dtype: elementwise.default_config(shape[-1], dtype),
    prior=lambda shape, dtype, config: elementwise.prior(config, shape[-1], dtype),
)
