"""quantized_matmul's epilogues (q/k/v heads, the gated activation, the residual add) and its RMSNorm
prologue: qmv and qmv_split do them in the launch itself, checked on the Metal emulator (the dialect's
other rendering of the same body) against MLX's ops on the built-in's output; the other paths and the
built-in run them in MLX's ops, checked on CPU."""

from __future__ import annotations

import itertools

import mlx.core as mx
import pytest

from kernelfleet.kernels.catalog import affine
from kernelfleet.kernels.catalog import quantized_matmul_kernel as qmm
from kernelfleet.kernels.common import normal
from kernelfleet.kernels.render.launch import capture, intercept
from kernelfleet.kernels.spec import BadShape
from kernelfleet.kernels.testing import compile_strict, metal_kernel
from kernelfleet.kernels.testing.msl_clang import clang_path
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

# (batch, q heads, kv heads, head dim): N = (2 + 2 * 1) * 8 = 32 outputs, K = 128 (group 32: 4 groups)
HEADS = (2, 2, 1, 8)
K, N = 128, 32
CONFIGS = [  # qmv at 2 and 4 rows a warp; qmv_split with 2 warps on a row's steps (PAIR's shared-memory path)
    {"path": "qmv", "rpw": 2, "vw": 1, "tg": 64, "unr": 1},
    {"path": "qmv", "rpw": 4, "vw": 2, "tg": 64, "unr": 2},
    {"path": "qmv_split", "rpw": 4, "vw": 1, "tg": 64, "unr": 1},
]
# what each epilogue adds to the launch: make's parameters, and the inputs after the matmul's four
# (-1: RoPE's offset and freqs)
ROPE = -1
EPILOGUES = {
    "none": ({}, 0),
    "heads": ({"heads": HEADS}, 0),
    "heads_rope": ({"heads": HEADS, "rope": 0.5}, ROPE),
    "swiglu": ({"glu": "swiglu"}, 0),
    "residual": ({"residual": True}, 1),
}
OFFSET = 37  # RoPE's position: angles up to 37 * 0.5 radians at the first pair


def rope_inputs(head_dim: int, offset: int = OFFSET, base: float = 10000.0) -> list[mx.array]:
    """RoPE's offset and freqs (``base ** (2i / head_dim)``, as mx.fast.rope's own base gives them)."""
    return [mx.array([offset], mx.int32), base ** (mx.arange(0, head_dim, 2, dtype=mx.float32) / head_dim)]


def _inputs(dtype: str, extra: int, m: int = 2, bits: int = 4, norm: bool = False) -> list[mx.array]:
    """x, the weights, the norm's weight (with ``norm``) and ``extra`` residuals (:data:`ROPE`: RoPE's
    inputs)."""
    shape = (m, K, N, bits, 32)
    x, wq, sc, bi = qmm.make_inputs(shape, dtype, 3)
    x = (x * (1.0 + 2.0 * mx.arange(m)[:, None])).astype(x.dtype)  # rows of different RMS
    nw = [(normal((K,), "float32", 21) * 0.2 + 1.0).astype(x.dtype)] if norm else []
    rest = rope_inputs(HEADS[3]) if extra == ROPE else [normal((m, N), dtype, 11 + i) for i in range(extra)]
    return [x, wq, sc, bi, *nw, *rest]


def _reference(inputs: list[mx.array], **params: object) -> list[mx.array]:
    """The built-in in float32 throughout: what every candidate is checked against."""
    return qmm.builtin([t if t.dtype in (mx.uint32, mx.int32) else t.astype(mx.float32) for t in inputs],
                       **params)  # type: ignore[arg-type]


def _close(got: list[mx.array], want: list[mx.array], dtype: str) -> None:
    atol, rtol = affine.MATMUL_TOLERANCES[dtype].atol, affine.MATMUL_TOLERANCES[dtype].rtol
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want, strict=True):
        g32, w32 = g.astype(mx.float32), w.astype(mx.float32)
        err = mx.abs(g32 - w32) - (atol + rtol * mx.abs(w32))
        assert mx.all(err <= 0).item(), f"max excess {mx.max(err).item()}"


@pytest.mark.parametrize("norm", [None, 1e-5], ids=["", "norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c['path']}-rpw{c['rpw']}")
@pytest.mark.parametrize("name", sorted(EPILOGUES))
def test_the_kernel_writes_the_epilogue(name: str, config: dict[str, object], dtype: str, norm: float | None,
                                        emu: MetalEmuBackend) -> None:
    params, extra = EPILOGUES[name]
    params = {**params, "norm": norm} if norm is not None else params
    inputs = _inputs(dtype, extra, norm=norm is not None)
    shape = (2, K, N, 4, 32)
    want = _reference(inputs, **params)
    with capture() as launches:
        qmm.make(config, "metal", shape, dtype, **params)(inputs)
    assert len(launches) == 1, "one launch, no MLX op after it"
    with intercept(emu.launch):
        got = qmm.make(config, "metal", shape, dtype, **params)(inputs)
    mx.eval(got)
    _close(got, want, dtype)


def test_heads_are_in_attention_layout() -> None:
    """q, k and v as (batch, heads, 1, head dim): the rows of one position, split at the heads."""
    inputs = _inputs("float32", 0)
    q, k, v = qmm.builtin(inputs, heads=HEADS)
    y = qmm.builtin(inputs)[0]
    assert q.shape == (2, 2, 1, 8) and k.shape == v.shape == (2, 1, 1, 8)
    assert mx.array_equal(q[1, 1, 0], y[1, 8:16]).item()
    assert mx.array_equal(v[1, 0, 0], y[1, 24:32]).item()


def test_a_path_without_the_epilogue_runs_it_after_the_matmul(emu: MetalEmuBackend) -> None:
    """dq (and mma, the built-in) take the norm and the epilogue in MLX's ops: the built-in's values."""
    inputs = _inputs("float32", 1, norm=True)
    dq = {"path": "dq", "rpw": 1, "vw": 1, "tg": 128, "unr": 1}
    with intercept(emu.launch):
        got = qmm.make(dq, "metal", (2, K, N, 4, 32), "float32", residual=True, norm=1e-5)(inputs)
        mx.eval(got)
    _close(got, _reference(inputs, residual=True, norm=1e-5), "float32")


def test_gated_epilogue_needs_pairs_of_rows() -> None:
    """At one row a warp a warp cannot hold a gate row and its up row: the activation runs after."""
    config = {"path": "qmv", "rpw": 1, "vw": 1, "tg": 64, "unr": 1}
    with capture() as launches:
        qmm.make(config, "metal", (2, K, N, 4, 32), "float32", glu="swiglu")(_inputs("float32", 0))
    assert [r.rendered.name.split("_")[1] for r in launches] == ["qmv"]


@pytest.mark.parametrize(("params", "match"), [
    ({"heads": (3, 2, 1, 8)}, "does not split"),
    ({"heads": (2, 2, 1, 4)}, "does not split"),
    ({"glu": "geglu"}, "glu"),
    ({"glu": "swiglu", "residual": True}, "one epilogue"),
])
def test_bad_epilogues_are_refused(params: dict[str, object], match: str) -> None:
    with pytest.raises(BadShape, match=match):
        qmm.make(CONFIGS[0], "metal", (2, K, N, 4, 32), "float32", **params)  # type: ignore[arg-type]


@pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (apt-get install clang)")
def test_every_epilogue_passes_the_strict_metal_model() -> None:
    """Each epilogue's kernel, with and without the norm prologue, at every qmv and qmv_split config of a
    small decode shape it runs in (2 or more rows a warp), in the three dtypes, in the exact text MLX
    compiles."""
    shape = (2, 256, 64, 4, 32)
    heads = (2, 4, 2, 8)  # (4 + 2 * 2) * 8 = 64 outputs
    params = {**EPILOGUES, "heads": ({"heads": heads}, 0),
              "heads_rope": ({"heads": heads, "rope": 1.0}, ROPE)}
    kernels = []
    for dtype in ("float32", "float16", "bfloat16"):
        configs = [c for c in qmm.space(shape, dtype)
                   if c["path"] in ("qmv", "qmv_split") and int(c["rpw"]) >= 2]
        base = qmm.make_inputs(shape, dtype, 3)
        for (name, (p, extra)), norm in itertools.product(params.items(), (None, 1e-6)):
            if name == "none" and norm is None:
                continue  # the catalog's own qmv: test_metal_render
            nw = [] if norm is None else [mx.ones((256,), base[0].dtype)]
            rest = rope_inputs(8) if extra == ROPE else [normal((2, 64), dtype, 11) for _ in range(extra)]
            inputs = [*base, *nw, *rest]
            with capture() as launches:
                for config in configs:
                    qmm.make(config, "metal", shape, dtype, **p, norm=norm)(inputs)
            assert len(launches) == len(configs), name
            kernels += [metal_kernel(r.rendered.name, r.rendered.inputs, r.rendered.outputs,
                                     r.rendered.source, r.rendered.header, r.input_dtypes, r.input_shapes,
                                     r.output_dtypes, r.launch.template) for r in launches]
    report = compile_strict(kernels)
    print(f"strict MSL model, quantized_matmul epilogues: {report.summary()}")
    assert report.kernels == len(kernels) > 300
    assert report.ok, report.summary()
