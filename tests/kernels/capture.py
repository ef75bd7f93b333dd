"""Collect the launches every candidate of a spec makes, without a GPU (launch.capture)."""

from __future__ import annotations

from kernelfleet.kernels.launch import LaunchRecord, capture
from kernelfleet.kernels.spec import GpuBackend, KernelSpec, config_key


def records(spec: KernelSpec, backend: GpuBackend, dtype: str) -> list[tuple[LaunchRecord, str]]:
    """(record, unique function name) for every config of every test shape."""
    out: list[tuple[LaunchRecord, str]] = []
    seen: set[tuple[str, tuple[object, ...]]] = set()
    for shape in spec.test_shapes:
        inputs = spec.make_inputs(shape, dtype, 0)
        for config in spec.space(shape, dtype):
            with capture() as recs:
                spec.build(config, backend, shape, dtype)(inputs)
            assert recs, f"{spec.name} {config_key(config)} launched nothing"
            for rec in recs:
                key = (rec.rendered.name, tuple(str(v) for _, v in rec.launch.template))
                if key in seen:
                    continue
                seen.add(key)
                out.append((rec, f"{rec.rendered.name}_{len(out)}"))
    return out
