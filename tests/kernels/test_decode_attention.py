"""The decode step's attention kernel (``catalog.decode_attention``): one new position per sequence over a
KV cache's whole buffers, of which the first ``offset + 1`` positions count. Checked on the Metal emulator
(the dialect's other rendering of the same body) against the float32 attention, with the buffers' unused
positions holding large values that must not leak in; the strict Metal model and nvcc compile it."""

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
            ) -> list[mx.array]:
    """q, the cache's keys and values (positions ``length`` .. ``capacity`` - 1 hold 1e3: they must not
    count) and RoPE's offset (``length`` - 1, this step's position)."""
    q = normal((batch, heads, 1, dim), dtype, 1)
    kv = [normal((batch, kv_heads, capacity, dim), dtype, 2 + i) * 2.0 for i in range(2)]
    live = (mx.arange(capacity) < length)[None, None, :, None]
    keys, values = (mx.where(live, t, mx.array(1e3, t.dtype)).astype(t.dtype) for t in kv)
    return [q, keys, values, mx.array([length - 1], mx.int32)]


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
    inputs = _inputs(batch, heads, kv_heads, dim, length, capacity, dtype)
    scale = dim ** -0.5
    fn = da.make("metal", batch, heads, kv_heads, dim, dtype, scale)
    with intercept(emu.launch):
        got = fn(inputs)
        mx.eval(got)
    assert got[0].shape == (batch, heads, 1, dim) and got[0].dtype == inputs[0].dtype
    want = da.reference(*inputs[:3], length, scale)
    _check(got[0], want, dtype)
    # MLX's own attention over the slices, as mlx-lm calls it, agrees with the reference
    sliced = [t[:, :, :length] for t in inputs[1:3]]
    _check(mx.fast.scaled_dot_product_attention(inputs[0], *sliced, scale=scale), want, dtype)


def test_one_launch_and_unsupported_shapes_are_refused() -> None:
    inputs = _inputs(1, 4, 2, 64, 5, 8, "float16")
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
                da.make(backend, 1, 8, 2, dim, dtype, dim ** -0.5)(_inputs(1, 8, 2, dim, 3, 8, dtype))
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
