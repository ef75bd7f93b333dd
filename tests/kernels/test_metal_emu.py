"""The Metal emulator (kernels/testing): what it catches, and the catalog at production shapes.

- Mutation tests: each bug planted into one real kernel (its exact MSL) must fail -- as an emulator
  error (a barrier reached by only some threads, an access outside a buffer, a write into the slack
  around a threadgroup array ...) or as a mismatch against the spec's float32 reference -- while the
  unplanted kernel passes, under each schedule named for it: thread order, a shuffled order, and
  run-ahead (one SIMD-group past the others' SIMD-group calls: a write-after-read race on a reused
  reduction buffer shows only there).
- Production shapes: each day one config per kernel x decode shape in one dtype (in turn), and one
  dtype's config at the smallest large shape (when it has at most 2**24 elements), run against the
  reference: a fixed order of each space, advanced daily (tests/sampling.py: ``KERNELFLEET_TEST_SEED``
  pins the day; ``make test-full`` runs every config), so every config comes round. (The strict model
  compiles every config at every shape over three days.) Large shapes, and decode launches of over
  256 threadgroups by a config whose one kernel writes the op's outputs, run every k-th threadgroup
  only and compare the elements those groups wrote. (Every config at the test shapes runs in
  tests/kernels/test_catalog.py, backend ``metal-emu``.)
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import pytest
import sampling
from sampling import rotating

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.render.launch import LaunchRecord, intercept
from kernelfleet.kernels.spec import KernelSpec, Shape, config_key
from kernelfleet.kernels.testing import EmulationError, Emulator, compile_strict, metal_kernel
from kernelfleet.kernels.testing.mlx_metal import from_record, type_string
from kernelfleet.kernels.testing.msl_clang import clang_path
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend, from_numpy, to_numpy

pytestmark = pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (apt-get install clang)")

BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"
ROW_SUM_LOOP = "for (uint i = 0; i < wpr; ++i) {\n    s += buf[base + i];"
ROW_SUM_FROM_MINUS_ONE = "for (int i = -1; i < int(wpr); ++i) {\n    s += buf[int(base) + i];"
SCHEDULES = ("in-order", "shuffled", "run-ahead")
LOCKSTEP = SCHEDULES[:2]
LAYERNORM = {"tg": 256, "vec": 1, "rpg": 1}  # 8 SIMD-groups share each row sum
SPLIT = {"path": "qmv_split", "rpw": 2, "vw": 1, "tg": 64, "unr": 1}  # 2 SIMD-groups share a row's steps
# name: (kernel, dtype, config, where: "body" or "header", text, replacement, schedules that must catch it)
MUTATIONS = {
    "removed barrier": ("rmsnorm", "float32", {"tg": 256, "vec": 1, "rpg": 1}, "header", BARRIER, "",
                        LOCKSTEP),
    "barrier inside a branch": ("rmsnorm", "float32", {"tg": 256, "vec": 1, "rpg": 1}, "header",
                                "v;\n  }\n  " + BARRIER, "v;\n    " + BARRIER + "\n  }", LOCKSTEP),
    "wrong lane": ("topk_gating_softmax", "float32", {"tg": 64, "vec": 1}, "body",
                   "const unsigned lane = thread_index_in_simdgroup;",
                   "const unsigned lane = thread_index_in_simdgroup % 16;", LOCKSTEP),
    "wrong row base": ("rmsnorm", "float32", {"tg": 128, "vec": 1, "rpg": 1}, "body",
                       "x + row * D", "x + (row + 1) * D", LOCKSTEP),
    "identity warp sum": ("topk_gating_softmax", "float32", {"tg": 64, "vec": 1}, "header",
                          "return simd_sum(v);", "return v;", LOCKSTEP),
    "wrong shuffle mask": ("topk_gating_softmax", "float32", {"tg": 64, "vec": 1}, "header",
                           "simd_shuffle_xor(v, mask);", "simd_shuffle_xor(v, ushort(mask >> 1));", LOCKSTEP),
    # write-after-read race: layernorm's second row sum reuses the first's buffer. Its simd_sum comes
    # before its write, so a SIMD-group that runs ahead overwrites a slot a slower one has still to
    # read for the mean; running every thread until it blocks (in order or shuffled) never shows it
    "reduction buffer reused after a simd_sum": ("layernorm", "float32", LAYERNORM, "body", "(q, red_b,",
                                                 "(q, red_a,", ("run-ahead",)),
    # off by one below the array: reads buf[-1], which sat at a page's zeros and added nothing
    "read below a threadgroup array": ("layernorm", "float32", LAYERNORM, "header",
                                       ROW_SUM_LOOP, ROW_SUM_FROM_MINUS_ONE,
                                       ("in-order", "run-ahead")),
    # a stray write below the array (where another variable would be on a GPU): the slack is checked
    "write below a threadgroup array": ("layernorm", "float32", LAYERNORM, "header",
                                        "buf[warp] = v;", "buf[warp] = v;\n    buf[int(warp) - 9] = v;",
                                        ("in-order",)),
    # qmv_split's warps meet in shared memory: the first must wait for the others' sums
    "split-K sums read before the barrier": ("quantized_matmul", "float32", SPLIT, "body", BARRIER, "",
                                             LOCKSTEP),
}
CASES = [(m, s) for m in sorted(MUTATIONS) for s in MUTATIONS[m][-1]]
# a mutation's shape where not the spec's first test shape (which has a config of that path)
MUTATION_SHAPES = {"split-K sums read before the barrier": (1, 640, 8, 4, 128)}


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


def _emulator(schedule: str, cache: Emulator) -> Emulator:
    return Emulator(cache.cache, seed=7 if schedule == "shuffled" else 0, run_ahead=schedule == "run-ahead")


@pytest.mark.parametrize(("mutation", "schedule"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
def test_mutation_is_caught(mutation: str, schedule: str, emulator: Emulator) -> None:
    name, dtype, config, where, old, new, _ = MUTATIONS[mutation]
    spec = get_spec(name)
    shape = MUTATION_SHAPES.get(mutation, spec.test_shapes[0])
    em = _emulator(schedule, emulator)
    outs, ref = _run(spec, config, shape, dtype, em)  # the real kernel passes ...
    assert spec.compare(outs, ref, dtype).ok
    try:  # ... the mutant does not
        outs, ref = _run(spec, config, shape, dtype, em, (where, old, new))
    except EmulationError as e:
        print(f"{mutation} ({schedule}): emulator error: {str(e)[:200]}")
        return
    cmp = spec.compare(outs, ref, dtype)
    print(f"{mutation} ({schedule}): {cmp.detail}")
    assert not cmp.ok, f"{mutation} was not caught under the {schedule} schedule"


LARGE_GROUPS = 6  # threadgroups run per large-shape launch (every k-th, plus the last)
# and per decode-shape launch: all of a small one; every k-th of a wide one (a quantized LM head's
# 16,032 groups took 6.5 s of this host's CPU, a sixth of the kernel's whole daily sample)
DECODE_GROUPS = 256
# threads one config may emulate in the daily sample: a kernel that dequantizes a whole weight (4-bit
# LM head: 525M weights; 128 experts of 2048x768) takes 8-25 s of this host's CPU and is left to
# make test-full (its code runs daily at the test shapes, in test_catalog.py's metal-emu)
DAILY_THREADS = 1 << 22
LARGE_MAX_ELEMENTS = 1 << 24  # larger inputs cost CI seconds and 100s of MB to make and hand over


def _written(out: mx.array) -> np.ndarray:
    """Which elements a launch wrote (the emulator fills outputs with 0xFF bytes first)."""
    raw = to_numpy(out)
    fill = np.iinfo(np.uint32).max if raw.dtype.itemsize == 4 else np.iinfo(np.uint16).max
    return raw.view(np.uint32 if raw.dtype.itemsize == 4 else np.uint16) != fill


VECTOR_BODY = """uint i = thread_position_in_grid.x;
  float2 p = float2(x[i], -x[i]);
  float4 f = float4(p, 0.5f * x[i], 3.0f);
  half4 h = half4(f);
  half4 hh = h * h + h;
  bfloat4 b = bfloat4(f);
  float4 g = float4(b) + float4(hh);
  int4 n = int4(f * 4.0f);
  float4 s = float4(float2(half2(half(1.5f))), float(uint2(n.xy).x & 1u), 2.0f);
  float4 r = g + float4(n) + s;
  out[4 * i] = r.x; out[4 * i + 1] = r.y; out[4 * i + 2] = r.z; out[4 * i + 3] = r.w;"""


def test_vector_constructors_and_conversions_run_as_on_metal(emulator: Emulator) -> None:
    """MSL's vector constructors and element-wise conversions (msl.h's kf_make_vector; MSL spec 2.2,
    2.12), half and bfloat vectors included, against numpy: every conversion rounds as Metal's (to
    nearest even; float to int truncates), half arithmetic rounds each result to half."""
    kernel = metal_kernel("vector_constructors", ["x"], ["out"], VECTOR_BODY, "", [mx.float32], [(64,)],
                          [mx.float32])
    assert compile_strict([kernel]).ok  # valid MSL: the strict model accepts it
    x = (np.random.default_rng(0).standard_normal(64) * 100).astype(np.float32)
    (out,) = emulator.run(kernel, [x], [((256,), "float")], (64, 1, 1), (32, 1, 1))
    f = np.stack([x, -x, np.float32(0.5) * x, np.full_like(x, 3.0)], 1)
    h = f.astype(np.float16)
    hh = (h * h + h).astype(np.float32)
    b = np.array(mx.array(f).astype(mx.bfloat16).astype(mx.float32))
    n = (f * np.float32(4.0)).astype(np.int32)
    odd = (n[:, 0].astype(np.uint32) & 1).astype(np.float32)
    s = np.stack([np.full_like(x, 1.5), np.full_like(x, 1.5), odd, np.full_like(x, 2.0)], 1)
    ref = (b + hh) + n.astype(np.float32) + s
    np.testing.assert_array_equal(out.reshape(64, 4), ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_sampled_production_shapes(name: str, emulator: Emulator) -> None:
    spec = get_spec(name)
    rng = random.Random(f"{sampling.seed()}-{name}")
    picks: list[tuple[str, Shape, dict[str, int]]] = []
    total = over = 0
    large_dtype = rng.choice(spec.dtypes)  # one dtype a day at the (smallest) large shape
    decode = [tuple(s) for s in spec.shapes.get("decode", ())]
    smallest = min((tuple(s) for s in spec.shapes.get("large", ())), key=lambda s: int(np.prod(s)))
    large = [smallest] if np.prod(smallest) <= LARGE_MAX_ELEMENTS else []
    for i, shape in enumerate(decode + large):
        # a decode shape runs in one dtype a day, in turn, and a config of its space in that dtype
        turn, today = divmod(sampling.seed() + i, len(spec.dtypes))
        for d, dtype in enumerate(spec.dtypes):
            configs = spec.space_for(shape, dtype, "metal")
            total += len(configs)
            runs = sampling.full() or (d == today if shape in decode else dtype == large_dtype)
            if not runs:
                continue
            if not sampling.full():  # within the day's budget (make test-full runs them all)
                cheap = [c for c in configs if _emulated_threads(spec, c, shape, dtype) <= DAILY_THREADS]
                over += len(configs) - len(cheap)
                configs = cheap
            if configs:
                picks += [(dtype, shape, c) for c in rotating(configs, 1, f"{name}-{dtype}-{shape}", turn)]
    kernels = [from_record(rec) for dtype, shape, config in picks
               for rec in _records(spec, config, shape, dtype)]
    emulator.build(kernels)  # one batch
    failures = []
    not_here = 0  # configs whose MLX op beside the kernel takes float32 only on MLX's CPU backend
    queue = list(picks)
    while queue:
        dtype, shape, config = queue.pop(0)
        stride = _stride(spec, config, shape, dtype)
        try:
            outs, ref = _run(spec, config, shape, dtype, emulator, group_stride=stride)
            mx.eval(outs)
        except EmulationError as e:
            failures.append(f"{shape} {dtype} {config_key(config)}: {str(e)[:300]}")
            continue
        except RuntimeError as e:
            if MetalEmuBackend().unsupported_reason(e) is None:
                raise
            not_here += 1
            if dtype != "float32" and "float32" in spec.dtypes:  # that shape's float32 config instead
                instead = ("float32", shape, rotating(spec.space_for(shape, "float32", "metal"), 1,
                                                      f"{name}-float32-{shape}")[0])
                picks.append(instead)
                queue.append(instead)
            continue
        if stride > 1:  # compare what the groups that ran wrote
            masks = [_written(o) for o in outs]
            assert all(m.any() for m in masks), "the sampled groups wrote nothing"
            outs = [from_numpy(to_numpy(o)[m], o.dtype) for o, m in zip(outs, masks, strict=True)]
            ref = [mx.array(np.array(r)[m]) for r, m in zip(ref, masks, strict=True)]
        cmp = spec.compare(outs, ref, dtype)
        if not cmp.ok:
            failures.append(f"{shape} {dtype} {config_key(config)}: {cmp.detail}")
    print(sampling.covered(f"{name} production-shape configs run", len(picks) - not_here, total)
          + (f"; {not_here} not runnable on MLX's CPU backend (a float32-only op), run in float32 instead"
             if not_here else "")
          + (f"; {over} of the day's dtype over the daily emulation budget (make test-full runs them)"
             if over else ""))
    if not picks:
        pytest.skip(f"every {name} config at its production shapes is over the daily emulation budget "
                    "(the test shapes run them in test_catalog.py's metal-emu; make test-full runs these)")
    assert not_here < len(picks), "no sampled config could run here"
    assert not failures, "\n".join(failures)


def _records(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> list[LaunchRecord]:
    from kernelfleet.kernels.common import shapes_only
    from kernelfleet.kernels.render.launch import capture

    with shapes_only():
        inputs = spec.make_inputs(shape, dtype, 0)
    with capture() as recs:
        spec.build(config, "metal", shape, dtype)(inputs)
    return recs


def _stride(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> int:
    """Run every k-th threadgroup: of a large launch, or a wide decode one, that writes the op's outputs."""
    if not _writes_the_outputs(spec, config, shape, dtype):
        return 1
    most = DECODE_GROUPS if shape in spec.shapes.get("decode", ()) else LARGE_GROUPS
    return max(1, _groups(spec, config, shape, dtype) // most)


def _emulated_threads(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> int:
    """The threads the emulator runs for one config at ``shape`` (every k-th group where it may)."""
    threads = sum(int(np.prod(r.launch.grid)) for r in _records(spec, config, shape, dtype))
    return threads // _stride(spec, config, shape, dtype)


def _writes_the_outputs(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> bool:
    """Whether the config is one launch that writes the op's outputs (so that running some of its
    threadgroups checks what they wrote), not a kernel whose output an MLX op goes on to read."""
    from kernelfleet.kernels.common import shapes_only

    records = _records(spec, config, shape, dtype)
    with shapes_only():
        outputs = spec.reference(spec.make_inputs(shape, dtype, 0))
    written = [tuple(s) for s in records[0].output_shapes]
    return len(records) == 1 and written == [tuple(o.shape) for o in outputs]


def _groups(spec: KernelSpec, config: dict[str, int], shape: Shape, dtype: str) -> int:
    launch = _records(spec, config, shape, dtype)[0].launch
    grid, tg = launch.grid, launch.threadgroup
    return int(np.prod([-(-g // min(t, g)) for g, t in zip(grid, tg, strict=True)]))
