"""Collect the launches every candidate of a spec makes, without a GPU (launch.capture)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.common import shapes_only
from kernelfleet.kernels.render.launch import LaunchRecord, capture
from kernelfleet.kernels.spec import GpuBackend, KernelSpec, Shape, config_key
from kernelfleet.kernels.testing.mlx_metal import MetalKernel, from_record


def records(spec: KernelSpec, backend: GpuBackend, dtype: str,
            shapes: Sequence[Shape] | None = None) -> list[tuple[LaunchRecord, str]]:
    """(record, unique function name) for every config of every shape (default: the test shapes)."""
    out: list[tuple[LaunchRecord, str]] = []
    seen: set[tuple[object, ...]] = set()
    for shape in spec.test_shapes if shapes is None else shapes:
        with shapes_only():  # only the inputs' shapes and dtypes reach a captured launch
            inputs = spec.make_inputs(shape, dtype, 0)
        for config in spec.space_for(shape, dtype, backend):
            with capture() as recs:
                spec.build(config, backend, shape, dtype)(inputs)
            assert recs, f"{spec.name} {config_key(config)} launched nothing"
            for rec in recs:
                # what MLX's kernel name encodes: source, template values, input dtypes and how
                # each input is passed (0-d, fewer than 8 elements: constant)
                key = (rec.rendered.name, tuple(str(v) for _, v in rec.launch.template),
                       tuple(str(d) for d in rec.input_dtypes),
                       tuple((len(s), math.prod(s) < 8) for s in rec.input_shapes))
                if key in seen:
                    continue
                seen.add(key)
                out.append((rec, f"{rec.rendered.name}_{len(out)}"))
    return out


def shapes_of(spec: KernelSpec, kinds: Sequence[str]) -> list[Shape]:
    """The spec's shapes of the given kinds: "test" (``test_shapes``), "decode", "large"."""
    return [tuple(s) for kind in kinds
            for s in (spec.test_shapes if kind == "test" else spec.shapes.get(kind, ()))]


def metal_kernels(kinds: Sequence[str] = ("test", "decode", "large")) -> list[MetalKernel]:
    """Every distinct Metal kernel (MLX kernel name) the catalog launches at those shapes: each
    kernel x dtype x config, as MLX would compile it."""
    out: dict[str, MetalKernel] = {}
    for name in NAMES:
        spec = get_spec(name)
        for dtype in spec.dtypes:
            for rec, _ in records(spec, "metal", dtype, shapes_of(spec, kinds)):
                k = from_record(rec)
                out.setdefault(k.name, k)
    return list(out.values())
