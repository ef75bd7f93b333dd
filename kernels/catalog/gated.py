"""The gated-activation kernels (GLU family): ``act(gate) * up`` elementwise, gate and up both
``rows x D``. A member names its activation once in the dialect (for the rendered kernel) and
once in MLX ops (for the float32 reference and the ``mx.compile``d built-in)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, normal
from ..render.dialect import source_version
from ..render.launch import KernelSource
from ..spec import Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import elementwise

Activation = Callable[[mx.array], mx.array]
AXES = ("hint", "fm")


def source(name: str, activation: str) -> KernelSource:
    """The kernel body. ``activation`` is dialect code that, from the gate value ``float x`` and the
    up vector ``u``, stores ``o.v[k]`` (the result for element ``k``); it may branch on the template
    constant ``FM`` (the ``fm`` axis: 1 = its fast-math spelling). Loads and stores take the ``hint``
    axis (template constant ``H``)."""
    body = elementwise.INDEX + r"""
#pragma unroll
  for (int s = 0; s < IPT; ++s) {
    const KF_SIZE i = base + KF_SIZE(s) * TG;
    if (i < nvec) {
      kf_vec<T, V> g = kf_vload_h<V, H>(a, i);
      kf_vec<T, V> u = kf_vload_h<V, H>(b, i);
      kf_vec<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float x = float(g.v[k]);
""" + activation + r"""
      }
      kf_vstore_h<V, H>(out, i, o);
    }
  }
"""
    return KernelSource(name, body, ("a", "b"), ("out",))


def spec(
    name: str, description: str, src: KernelSource, activation: Activation, module_file: str
) -> KernelSpec:
    def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
        def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
            return elementwise.run_elementwise(src, backend, config, dtype, list(inputs), [], AXES)

        return fn

    def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
        g, u = (a.astype(mx.float32) for a in inputs)
        return [activation(g) * u]

    compiled = mx.compile(lambda g, u: activation(g) * u)

    def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
        return [compiled(inputs[0], inputs[1])]

    def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
        elementwise.check_shape(name, shape)
        return [normal(shape, dtype, seed, 0, scale=2.0), normal(shape, dtype, seed, 1)]

    fields = elementwise.spec_fields(name, module_file, decode_cols=14336, axes=AXES)
    fields["version"] = source_version(module_file, __file__, elementwise.__file__)
    return KernelSpec(
        name=name,
        description=description,
        make_inputs=make_inputs,
        reference=reference,
        builtin=builtin,
        build=make,
        tolerances=TOLERANCES,
        bytes_moved=lambda shape, dtype: 3 * shape[0] * shape[1] * ITEMSIZE[dtype],
        **fields,
    )
