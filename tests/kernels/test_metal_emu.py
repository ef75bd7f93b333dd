"""The Metal emulator (kernels/testing): what it catches, and the catalog at production shapes.

- Mutation tests: each bug planted into one real kernel (its exact MSL) must fail -- as an emulator
  error (a barrier reached by only some threads, an access outside a buffer ...) or as a mismatch
  against the spec's float32 reference -- while the unplanted kernel passes, in thread order and
  in a shuffled order.
- Production shapes: each day one config per kernel x dtype x decode shape, and one dtype's config at
  the smallest large shape (when it has at most 2**24 elements), run against the reference: a fixed
  order of each space, advanced daily (``KF_METAL_EMU_SEED`` pins the day), so every config comes
  round. (The strict model compiles every config at every shape.) Large shapes run every k-th
  threadgroup only and compare the elements those groups wrote. (Every config at the test shapes
  runs in tests/kernels/test_catalog.py, backend ``metal-emu``.)
"""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.launch import LaunchRecord, intercept
from kernelfleet.kernels.spec import KernelSpec, Shape, config_key
from kernelfleet.kernels.testing import EmulationError, Emulator, metal_kernel
from kernelfleet.kernels.testing.emu_backend import from_numpy, to_numpy
from kernelfleet.kernels.testing.mlx_metal import from_record, type_string
from kernelfleet.kernels.testing.msl_clang import clang_path

pytestmark = pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (apt-get install clang)")

BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"
# name: (kernel, dtype, config, where: "body" or "header", text, replacement)
MUTATIONS = {
    "removed barrier": ("rmsnorm", "float32", {"tg": 256, "vec": 1, "rpg": 1}, "header", BARRIER, ""),
    "barrier inside a branch": ("rmsnorm", "float32", {"tg": 256, "vec": 1, "rpg": 1}, "header",
                                "v;\n  }\n  " + BARRIER, "v;\n    " + BARRIER + "\n  }"),
    "wrong lane": ("topk_gating_softmax", "float32", {"tg": 64, "vec": 1}, "body",
                   "const unsigned lane = thread_index_in_simdgroup;",
                   "const unsigned lane = thread_index_in_simdgroup % 16;"),
    "wrong row base": ("rmsnorm", "float32", {"tg": 128, "vec": 1, "rpg": 1}, "body",
                       "x + row * D", "x + (row + 1) * D"),
    "identity warp sum": ("topk_gating_softmax", "float32", {"tg": 64, "vec": 1}, "header",
                          "return simd_sum(v);", "return v;"),
    "wrong shuffle mask": ("topk_gating_softmax", "float32", {"tg": 64, "vec": 1}, "header",
                           "simd_shuffle_xor(v, mask);", "simd_shuffle_xor(v, ushort(mask >> 1));"),
}


def _run(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str, emulator: Emulator,
         mutate: tuple[str, str, str] | None = None,
         group_stride: int = 1) -> tuple[list[mx.array], list[mx.array]]:
    """(outputs, float32 reference) of one config on the emulator, the kernel mutated if asked."""

    def launch(rec: LaunchRecord, inputs: Sequence[mx.array]) -> list[mx.array]:
        r = rec.rendered
        body, header = r.source, r.header
        if mutate is not None:
            where, old, new = mutate
            text = body if where == "body" else header
            assert old in text, f"mutation target not found: {old!r}"
            text = text.replace(old, new, 1)
            body, header = (text, header) if where == "body" else (body, text)
        kernel = metal_kernel(r.name + ("_mutant" if mutate else ""), r.inputs, r.outputs, body, header,
                              rec.input_dtypes, rec.input_shapes, rec.output_dtypes, rec.launch.template)
        outputs = [(s, type_string(d)) for s, d in zip(rec.output_shapes, rec.output_dtypes, strict=True)]
        outs = emulator.run(kernel, [to_numpy(a) for a in inputs], outputs, rec.launch.grid,
                            rec.launch.threadgroup, group_stride=group_stride)
        return [from_numpy(o, d) for o, d in zip(outs, rec.output_dtypes, strict=True)]

    inputs = spec.make_inputs(shape, dtype, 0)
    ref = spec.reference(inputs)
    with intercept(launch):
        outs = spec.build(config, "metal", shape, dtype)(inputs)
    return outs, ref


@pytest.fixture(scope="module")
def emulator() -> Emulator:
    return Emulator()


@pytest.mark.parametrize("seed", [0, 7], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutation_is_caught(mutation: str, seed: int, emulator: Emulator) -> None:
    name, dtype, config, where, old, new = MUTATIONS[mutation]
    spec = get_spec(name)
    shape = spec.test_shapes[0]
    em = Emulator(emulator.cache, seed=seed)
    outs, ref = _run(spec, config, shape, dtype, em)  # the real kernel passes ...
    assert spec.compare(outs, ref, dtype).ok
    try:  # ... the mutant does not
        outs, ref = _run(spec, config, shape, dtype, em, (where, old, new))
    except EmulationError as e:
        print(f"{mutation}: emulator error: {str(e)[:200]}")
        return
    cmp = spec.compare(outs, ref, dtype)
    print(f"{mutation}: {cmp.detail}")
    assert not cmp.ok, f"{mutation} was not caught"


def day_seed() -> int:
    return int(os.environ.get("KF_METAL_EMU_SEED") or datetime.datetime.now(datetime.UTC).date().toordinal())


PER_SHAPE = 1  # configs per kernel x dtype x decode shape each day (a fixed order, rotating daily)
LARGE_GROUPS = 6  # threadgroups run per large-shape launch (every k-th, plus the last)
LARGE_MAX_ELEMENTS = 1 << 24  # larger inputs cost CI seconds and 100s of MB to make and hand over


def _written(out: mx.array) -> np.ndarray:
    """Which elements a launch wrote (the emulator fills outputs with 0xFF bytes first)."""
    raw = to_numpy(out)
    fill = np.iinfo(np.uint32).max if raw.dtype.itemsize == 4 else np.iinfo(np.uint16).max
    return raw.view(np.uint32 if raw.dtype.itemsize == 4 else np.uint16) != fill


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_sampled_production_shapes(name: str, emulator: Emulator) -> None:
    spec = get_spec(name)
    rng = random.Random(f"{day_seed()}-{name}")
    picks: list[tuple[str, Shape, dict[str, int]]] = []
    total = 0
    large_dtype = rng.choice(spec.dtypes)  # one dtype a day at the (smallest) large shape
    for dtype in spec.dtypes:
        decode = [tuple(s) for s in spec.shapes.get("decode", ())]
        smallest = min((tuple(s) for s in spec.shapes.get("large", ())), key=lambda s: int(np.prod(s)))
        large = [smallest] if np.prod(smallest) <= LARGE_MAX_ELEMENTS else []
        for shape in decode + large:
            configs = spec.space(shape, dtype)
            total += len(configs)
            n = PER_SHAPE if shape in decode else int(dtype == large_dtype)
            order = random.Random(f"{name}-{dtype}-{shape}").sample(configs, len(configs))
            start = day_seed() * n % len(configs)
            picks += [(dtype, shape, c) for c in (order + order)[start:start + min(n, len(configs))]]
    kernels = [from_record(rec) for dtype, shape, config in picks
               for rec in _records(spec, config, shape, dtype)]
    emulator.build(kernels)  # one batch
    failures = []
    for dtype, shape, config in picks:
        grid_groups = _groups(spec, config, shape, dtype)
        stride = 1 if shape in spec.shapes.get("decode", ()) else max(1, grid_groups // LARGE_GROUPS)
        try:
            outs, ref = _run(spec, config, shape, dtype, emulator, group_stride=stride)
        except EmulationError as e:
            failures.append(f"{shape} {dtype} {config_key(config)}: {str(e)[:300]}")
            continue
        if stride > 1:  # compare what the groups that ran wrote
            masks = [_written(o) for o in outs]
            assert all(m.any() for m in masks), "the sampled groups wrote nothing"
            outs = [from_numpy(to_numpy(o)[m], o.dtype) for o, m in zip(outs, masks, strict=True)]
            ref = [mx.array(np.array(r)[m]) for r, m in zip(ref, masks, strict=True)]
        cmp = spec.compare(outs, ref, dtype)
        if not cmp.ok:
            failures.append(f"{shape} {dtype} {config_key(config)}: {cmp.detail}")
    print(f"{name}: {len(picks)} sampled production-shape runs of {total} configs "
          f"({len(picks) / total:.1%}), seed {day_seed()}")
    assert not failures, "\n".join(failures)


def _records(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> list[LaunchRecord]:
    from kernelfleet.kernels.common import shapes_only
    from kernelfleet.kernels.launch import capture

    with shapes_only():
        inputs = spec.make_inputs(shape, dtype, 0)
    with capture() as recs:
        spec.build(config, "metal", shape, dtype)(inputs)
    return recs


def _groups(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> int:
    launch = _records(spec, config, shape, dtype)[0].launch
    grid, tg = launch.grid, launch.threadgroup
    return int(np.prod([-(-g // min(t, g)) for g, t in zip(grid, tg, strict=True)]))
