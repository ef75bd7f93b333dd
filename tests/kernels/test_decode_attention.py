"""The decode step's attention kernel (``catalog.decode_attention``): one new position per sequence over a
KV cache's whole buffers, of which the first ``offset`` positions count, and the step's own position from
its keys and values (the layer block writes them into the cache after the launch). Checked on the Metal
emulator (the dialect's other rendering of the same body) against the float32 attention, with the
buffers' unused positions, the step's own included, holding large values that must not leak in, and
with planted bugs that the check must catch; the strict Metal model and nvcc compile it."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.kernels.catalog import decode_attention as da
from kernelfleet.kernels.common import normal
from kernelfleet.kernels.render.launch import capture, intercept
from kernelfleet.kernels.spec import BadShape
from kernelfleet.kernels.testing import compile_strict, metal_kernel
from kernelfleet.kernels.testing.msl_clang import clang_path
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

from .mlx_sources import cuda_unit
from .test_cuda_render import NVCC, _nvcc

TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}  # of the largest output


def _inputs(batch: int, heads: int, kv_heads: int, dim: int, length: int, capacity: int, dtype: str
            ) -> tuple[list[mx.array], list[mx.array]]:
    """The launch's inputs: q, the step's keys and values (position ``length`` - 1), the cache's buffers
    before the step is written (positions ``length`` - 1 .. ``capacity`` - 1 hold 1e3: they must not
    count) and RoPE's offset (``length`` - 1); and the buffers with the step written, the reference's."""
    q = normal((batch, heads, 1, dim), dtype, 1)
    kv = [normal((batch, kv_heads, capacity, dim), dtype, 2 + i) * 2.0 for i in range(2)]
    at = mx.arange(capacity)[None, None, :, None]
    big = [mx.array(1e3, t.dtype) for t in kv]
    before = [mx.where(at < length - 1, t, b).astype(t.dtype) for t, b in zip(kv, big, strict=True)]
    after = [mx.where(at < length, t, b).astype(t.dtype) for t, b in zip(kv, big, strict=True)]
    now = [t[:, :, length - 1:length] for t in kv]
    return [q, *now, *before, mx.array([length - 1], mx.int32)], after


def _check(got: mx.array, want: mx.array, dtype: str) -> None:
    err = mx.max(mx.abs(got.astype(mx.float32) - want)).item()
    assert err <= TOL[dtype] * max(1.0, mx.max(mx.abs(want)).item()), err


CASES = [  # (batch, heads, kv heads, head dim, positions, buffer capacity)
    (1, 4, 2, 64, 1, 8),  # the first position: one warp has work, fifteen none
    (1, 4, 1, 64, 37, 64),  # four query heads a KV head, a partial block of U at the end
    (2, 2, 2, 128, 130, 256),  # two sequences, every warp several blocks
    (1, 2, 1, 256, 9, 16),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_attention_over_the_caches_first_positions(case: tuple[int, ...], dtype: str,
                                                   emu: MetalEmuBackend) -> None:
    batch, heads, kv_heads, dim, length, capacity = case
    inputs, written = _inputs(batch, heads, kv_heads, dim, length, capacity, dtype)
    scale = dim ** -0.5
    fn = da.make("metal", batch, heads, kv_heads, dim, dtype, scale)
    with intercept(emu.launch):
        got = fn(inputs)
        mx.eval(got)
    assert got[0].shape == (batch, heads, 1, dim) and got[0].dtype == inputs[0].dtype
    want = da.reference(inputs[0], *written, length, scale)
    _check(got[0], want, dtype)
    # MLX's own attention over the written cache's slices, as mlx-lm calls it, agrees with the reference
    sliced = [t[:, :, :length] for t in written]
    _check(mx.fast.scaled_dot_product_attention(inputs[0], *sliced, scale=scale), want, dtype)


# planted bugs the check above must catch: the step's own position read from the buffers (not yet
# written there); positions past the length weighted; the length taken for the buffers' head stride
MUTANTS = {"own position from the cache": ("now ? kn : k", "k"),
           "past the length": ("p0 + u < len ? KF_EXP(s[u] - top) : 0.0f", "KF_EXP(s[u] - top)"),
           "head stride": ("kvh * cap + KF_SIZE(p)", "kvh * KF_SIZE(len) + KF_SIZE(p)")}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_planted_bug_fails_the_check(mutant: str, emu: MetalEmuBackend, monkeypatch: pytest.MonkeyPatch
                                       ) -> None:
    good, bad = MUTANTS[mutant]
    assert da.BODY.count(good) == 1
    inputs, written = _inputs(1, 4, 2, 64, 37, 64, "float32")
    want = da.reference(inputs[0], *written, 37, 0.125)
    monkeypatch.setattr(da, "BODY", da.BODY.replace(good, bad))
    with intercept(emu.launch):
        got = da.make("metal", 1, 4, 2, 64, "float32", 0.125)(inputs)[0]
        mx.eval(got)
    with pytest.raises(AssertionError):
        _check(got, want, "float32")


def test_one_launch_and_unsupported_shapes_are_refused() -> None:
    inputs, _ = _inputs(1, 4, 2, 64, 5, 8, "float16")
    with capture() as launches:
        da.make("cuda", 1, 4, 2, 64, "float16", 0.125)(inputs)
    assert [r.rendered.name.rsplit("_", 1)[0] for r in launches] == ["kf_decode_attention"]
    assert not da.supports(4, 3, 64, "float16") and not da.supports(4, 2, 96, "float16")
    with pytest.raises(BadShape, match="head dim"):
        da.make("cuda", 1, 4, 2, 96, "float16", 0.125)


def _records(backend: str) -> list:
    recs = []
    for dtype in da.DTYPES:
        for dim in da.HEAD_DIMS:
            with capture() as launches:
                da.make(backend, 1, 8, 2, dim, dtype, dim ** -0.5)(_inputs(1, 8, 2, dim, 3, 8, dtype)[0])
            recs += launches
    return recs


@pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (apt-get install clang)")
def test_every_instantiation_passes_the_strict_metal_model() -> None:
    kernels = [metal_kernel(r.rendered.name, r.rendered.inputs, r.rendered.outputs, r.rendered.source,
                            r.rendered.header, r.input_dtypes, r.input_shapes, r.output_dtypes,
                            r.launch.template) for r in _records("metal")]
    report = compile_strict(kernels)
    assert report.kernels == len(da.DTYPES) * len(da.HEAD_DIMS) and report.ok, report.summary()


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_every_instantiation_compiles_for_cuda(tmp_path: object) -> None:
    recs = _records("cuda")
    unit = cuda_unit([(r, f"k{i}") for i, r in enumerate(recs)])
    proc = _nvcc(unit, tmp_path / "attn.cu")  # type: ignore[operator]
    assert proc.returncode == 0, proc.stderr[-3000:]
