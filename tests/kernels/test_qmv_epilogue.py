"""quantized_matmul's epilogues (q/k/v heads, the gated activation, the residual add): qmv and qmv_split
write them from the launch itself, checked on the Metal emulator (the dialect's other rendering of the
same body) against MLX's ops on the built-in's output; the other paths and the built-in run them in MLX's
ops, checked on CPU."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.kernels.catalog import quantized_matmul_kernel as qmm
from kernelfleet.kernels.common import normal
from kernelfleet.kernels.render.launch import capture, intercept
from kernelfleet.kernels.spec import BadShape
from kernelfleet.kernels.testing import compile_strict, metal_kernel
from kernelfleet.kernels.testing.metal_emu import Emulator
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
EPILOGUES = {
    "heads": ({"heads": HEADS}, 0),
    "swiglu": ({"glu": "swiglu"}, 0),
    "residual": ({"residual": True}, 1),
}
# (atol, rtol): bfloat16 rounds y before the epilogue
TOL = {"float32": (2e-4, 2e-4), "bfloat16": (6e-2, 2e-2)}


def _inputs(dtype: str, extra: int, m: int = 2, bits: int = 4) -> list[mx.array]:
    shape = (m, K, N, bits, 32)
    x, wq, sc, bi = qmm.make_inputs(shape, dtype, 3)
    return [x, wq, sc, bi, *(normal((m, N), dtype, 11 + i) for i in range(extra))]


def _close(got: list[mx.array], want: list[mx.array], dtype: str) -> None:
    atol, rtol = TOL[dtype]
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want, strict=True):
        g32, w32 = g.astype(mx.float32), w.astype(mx.float32)
        err = mx.abs(g32 - w32) - (atol + rtol * mx.abs(w32))
        assert mx.all(err <= 0).item(), f"max excess {mx.max(err).item()}"


@pytest.fixture(scope="module")
def emu() -> MetalEmuBackend:
    backend = MetalEmuBackend(Emulator(seed=0))
    if not backend.available():
        pytest.skip("the Metal emulator needs clang++")
    return backend


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c['path']}-rpw{c['rpw']}")
@pytest.mark.parametrize("name", sorted(EPILOGUES))
def test_the_kernel_writes_the_epilogue(name: str, config: dict[str, object], dtype: str,
                                        emu: MetalEmuBackend) -> None:
    params, extra = EPILOGUES[name]
    inputs = _inputs(dtype, extra)
    shape = (2, K, N, 4, 32)
    want = qmm.builtin(inputs, **params)
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
    """dq (and mma, the built-in) take the epilogue in MLX's ops: the same values as the built-in."""
    inputs = _inputs("float32", 1)
    dq = {"path": "dq", "rpw": 1, "vw": 1, "tg": 128, "unr": 1}
    with intercept(emu.launch):
        got = qmm.make(dq, "metal", (2, K, N, 4, 32), "float32", residual=True)(inputs)
        mx.eval(got)
    _close(got, qmm.builtin(inputs, residual=True), "float32")


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
    """Each epilogue's kernel at every qmv and qmv_split config of a small decode shape that it writes
    itself (2 or more rows a warp), in the three dtypes, in the exact text MLX compiles."""
    shape = (2, 256, 64, 4, 32)
    params = {**EPILOGUES, "heads": ({"heads": (2, 4, 2, 8)}, 0)}  # (4 + 2 * 2) * 8 = 64 outputs
    kernels = []
    for dtype in ("float32", "float16", "bfloat16"):
        configs = [c for c in qmm.space(shape, dtype)
                   if c["path"] in ("qmv", "qmv_split") and int(c["rpw"]) >= 2]
        base = qmm.make_inputs(shape, dtype, 3)
        for name, (p, extra) in params.items():
            inputs = [*base, *(normal((2, 64), dtype, 11) for _ in range(extra))]
            with capture() as launches:
                for config in configs:
                    qmm.make(config, "metal", shape, dtype, **p)(inputs)
            assert len(launches) == len(configs), name
            kernels += [metal_kernel(r.rendered.name, r.rendered.inputs, r.rendered.outputs,
                                     r.rendered.source, r.rendered.header, r.input_dtypes, r.input_shapes,
                                     r.output_dtypes, r.launch.template) for r in launches]
    report = compile_strict(kernels)
    print(f"strict MSL model, quantized_matmul epilogues: {report.summary()}")
    assert report.kernels == len(kernels) > 100
    assert report.ok, report.summary()
