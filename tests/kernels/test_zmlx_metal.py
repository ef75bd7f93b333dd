"""zmlx's own kernels, off a Mac: every launch zmlx's functions make for the catalog's zmlx family
(every kernel x dtype x test shape x threadgroup) is captured (``kernels.zmlx_capture``) and its
exact MLX Metal text goes through the strict MSL compile model and the Metal CPU emulator
(``kernels.testing``), whose outputs are checked against the float32 reference.

zmlx's kernels run on Macs in the wild, so they are ground truth for both models here: a failure
is a bug in the model, not in zmlx. A failure whose every message is one of :data:`MODEL_BUGS` is
reported as an xfail naming the bug (so ``-ra`` lists it, and a fixed model makes the test pass);
any other failure, and every wrong number, fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.kernels.catalog import ZMLX_NAMES, get_spec
from kernelfleet.kernels.spec import DTYPES, Config, KernelSpec, Shape
from kernelfleet.kernels.zmlx.capture import ZmlxLaunch, capture, intercept

testing = pytest.importorskip("kernelfleet.kernels.testing")
from kernelfleet.kernels.testing.metal_emu import EmulationError, Emulator  # noqa: E402
from kernelfleet.kernels.testing.mlx_metal import MetalKernel, metal_kernel, type_string  # noqa: E402
from kernelfleet.kernels.testing.msl_clang import clang_path  # noqa: E402

pytestmark = pytest.mark.skipif(clang_path() is None,
                                reason="clang++ is not installed (apt-get install clang)")

# Bugs of the models found by zmlx's kernels: (a message clang gives, what the model gets wrong).
MODEL_BUGS: tuple[tuple[str, str], ...] = (
    # fixed since: <metal_stdlib> (a shim including msl.h), half op half giving half in the emulator,
    # bfloat comparisons, a conditional between a private bfloat lvalue and a bfloat prvalue in the
    # strict model (zmlx's kk_sigmoid `(x < T(0)) ? y : T(1) - y`: clang keeps the address space of a
    # class-type operand, so the model's class bfloat was "incompatible operand types"; msl_strict
    # now converts such operands to prvalues, as MSL does for a scalar)
)


def known_model_bugs(errors: Sequence[str]) -> None:
    """xfail naming the bugs when every one of ``errors`` shows a known model bug; else return."""
    whys = [next((why for text, why in MODEL_BUGS if text in e), None) for e in errors]
    if whys and None not in whys:
        pytest.xfail("model bug(s), not zmlx's: " + "; ".join(sorted({w for w in whys if w})))


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    dtype: str
    shape: Shape
    config: Config


def cases(name: str) -> Iterator[Case]:
    spec = get_spec(name)
    for dtype in DTYPES:
        for shape in spec.test_shapes:
            for config in spec.space(shape, dtype):
                yield Case(spec, dtype, shape, config)


def mlx_text(r: ZmlxLaunch) -> MetalKernel:
    """What MLX compiles for this launch."""
    return metal_kernel(r.name, r.input_names, r.output_names, r.source, r.header, r.input_dtypes,
                        r.input_shapes, r.output_dtypes, r.template)


def captured(case: Case) -> list[ZmlxLaunch]:
    with capture() as records:
        case.spec.build(case.config, "metal", case.shape, case.dtype)(
            case.spec.make_inputs(case.shape, case.dtype, 0))
    assert len(records) == 1
    return records


PARAMS = [pytest.param(n, d, id=f"{n}-{d}") for n in ZMLX_NAMES for d in DTYPES]


@pytest.mark.parametrize(("name", "dtype"), PARAMS)
def test_strict_model_compiles_zmlx_s_launches(name: str, dtype: str) -> None:
    from kernelfleet.kernels.testing import compile_strict

    kernels = [mlx_text(r) for c in cases(name) if c.dtype == dtype for r in captured(c)]
    report = compile_strict(kernels, jobs=2)
    assert report.kernels == len({k.name for k in kernels}) > 0
    if not report.ok:
        known_model_bugs([e for errs in report.errors.values() for e in errs])
    assert report.ok, report.summary()


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Emulator:
    return Emulator(cache_dir=Path(tmp_path_factory.mktemp("metal-emu")), jobs=2)


def _numpy(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


def _mlx(a: np.ndarray, dtype: mx.Dtype) -> mx.array:
    return mx.array(a).view(mx.bfloat16) if dtype == mx.bfloat16 else mx.array(a)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype"), PARAMS)
def test_emulator_runs_zmlx_s_launches_to_the_reference(name: str, dtype: str, emulator: Emulator) -> None:
    mine = [c for c in cases(name) if c.dtype == dtype]
    try:
        emulator.build([mlx_text(r) for c in mine for r in captured(c)])  # one batch compile
    except EmulationError as e:
        known_model_bugs([line for line in str(e).splitlines() if "error:" in line])
        raise

    def run(r: ZmlxLaunch, inputs: Sequence[mx.array]) -> list[mx.array]:
        shapes = [(s, type_string(d)) for s, d in zip(r.output_shapes, r.output_dtypes, strict=True)]
        outs = emulator.run(mlx_text(r), [_numpy(a) for a in inputs], shapes, r.grid, r.threadgroup)
        return [_mlx(o, d) for o, d in zip(outs, r.output_dtypes, strict=True)]

    failures = []
    for c in mine:
        inputs = c.spec.make_inputs(c.shape, c.dtype, 0)
        with intercept(run):
            outs = c.spec.build(c.config, "metal", c.shape, c.dtype)(inputs)
        cmp = c.spec.compare(outs, c.spec.reference(inputs), c.dtype)
        if not cmp.ok:  # a wrong number is never a known bug
            failures.append(f"{c.shape} tg={c.config['tg']}: {cmp.detail}")
    assert not failures, f"{len(failures)} of {len(mine)} launches:\n" + "\n".join(failures)


@pytest.mark.slow
def test_a_pinned_llama_on_the_emulator_computes_what_mlx_computes(emulator: Emulator) -> None:
    """A random-weight mlx-lm Llama after ``kernelfleet.zmlx.patch``: its forward pass with every zmlx
    launch run by the Metal emulator gives MLX's own (unpatched) logits."""
    llama = pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is not installed")
    from kernelfleet.kernels.patch import profile_file
    from kernelfleet.zmlx import patch

    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                           vocab_size=50)
    mx.random.seed(3)
    model = llama.Model(args)
    tokens = mx.array([[3, 14, 15, 9]])
    expected = model(tokens)
    entries = [{"kernel": k, "shape": "4x64", "dtype": "float32", "config": {"tg": tg},
                "config_key": f"tg={tg}", "predicted": False}
               for k, tg in (("zmlx_rmsnorm", 32), ("zmlx_add_rmsnorm", 128))]
    body = {"schema": profile_file.SCHEMA, "chip": "Apple M3 Max", "entries": entries}
    report = patch(model, profile=body, tokens=[4], patterns=["swiglu_mlp", "rmsnorm", "residual_norm"])
    assert len(report.pinned) == 5 + 2 and len(report.kept_default) == 2  # swiglu: MetalKernel's default

    launched: list[tuple[str, int]] = []

    def run(r: ZmlxLaunch, inputs: Sequence[mx.array]) -> list[mx.array]:
        launched.append((r.name, r.threadgroup[0]))
        shapes = [(s, type_string(d)) for s, d in zip(r.output_shapes, r.output_dtypes, strict=True)]
        try:
            outs = emulator.run(mlx_text(r), [_numpy(a) for a in inputs], shapes, r.grid, r.threadgroup)
        except EmulationError as e:
            known_model_bugs([line for line in str(e).splitlines() if "error:" in line])
            raise
        return [_mlx(o, d) for o, d in zip(outs, r.output_dtypes, strict=True)]

    with intercept(run):
        got = model(tokens)
        mx.eval(got)
    assert sorted(set(launched)) == [("kk_add_rmsnorm_D64_TG128_E1e_05", 128),
                                     ("kk_rmsnorm_D64_TG32_E1e_05", 32), ("kk_swiglu2_fwd", 256)]
    assert mx.allclose(got, expected, atol=2e-4, rtol=2e-4).item(), mx.abs(got - expected).max().item()
