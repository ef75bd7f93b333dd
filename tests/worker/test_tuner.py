"""The tuner end to end on the CPU backend with real catalog kernels, checked field by field
against the tuning-report contract."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.chips import detect_chip
from kernelfleet.kernels.catalog import all_specs, get_spec
from kernelfleet.kernels.spec import (
    BadShape,
    KernelBuildError,
    KernelSpec,
    Tolerance,
    UnknownKernel,
    UnsupportedDtype,
)
from kernelfleet.worker.backends.base import Backend
from kernelfleet.worker.golden import digest, flatten_float32
from kernelfleet.worker.measure import AllCandidatesFailed
from kernelfleet.worker.report import report_problems
from kernelfleet.worker.tuner import tune, tune_spec


def test_rmsnorm_report_field_by_field():
    seen: list[tuple[int, int]] = []
    report = tune("rmsnorm", "8x256", "float16", seed=3, progress=lambda d, t: seen.append((d, t)))
    assert report_problems(report) == []
    assert (report["kernel"], report["shape"], report["dtype"], report["seed"], report["strategy"]) == \
        ("rmsnorm", "8x256", "float16", 3, "halving")
    chip = detect_chip()
    spec = get_spec("rmsnorm")
    assert report["env"] == {"chip": chip.name, "backend": "cpu", "mlx_version": mx.__version__,
                             "os": chip.os, "driver": None, "kernel_hash": spec.version, "gpu_cores": None,
                             "memory_bytes": chip.memory_bytes}
    (trial,) = report["trials"]  # the CPU backend runs the built-in only
    assert trial["config_key"] == "builtin" and trial["config"] == {"variant": "builtin"}
    assert trial["is_builtin"]
    assert trial["status"] == "ok" and trial["error"] is None and trial["n"] == 30 == len(trial["samples_us"])
    assert trial["p10_us"] <= trial["median_us"] <= trial["p90_us"]
    assert 0 <= trial["max_abs_err"] <= spec.tolerance("float16").atol + spec.tolerance("float16").rtol * 10
    assert report["best_config_key"] == "builtin"
    # the golden output is the built-in's output on the seeded inputs, computed independently here
    inputs = spec.make_inputs((8, 256), "float16", 3)
    out = mx.fast.rms_norm(inputs[0], inputs[1], 1e-5)
    flat = flatten_float32([out])
    g = report["golden"]
    assert g["digest"] == digest(flat) and g["numel"] == 8 * 256 and g["stride"] == 8
    assert g["sample"] == [float(v) for v in flat[::8]]
    assert g["stats"]["mean"] == pytest.approx(float(flat.astype(np.float64).mean()))
    assert seen and seen[-1][0] == seen[-1][1] and all(d <= t for d, t in seen)
    json.dumps(report, allow_nan=False)  # strict JSON


def test_same_seed_same_golden_other_seed_differs():
    a = tune("rmsnorm", "4x128", "float32", seed=0, strategy="exhaustive")
    b = tune("rmsnorm", "4x128", "float32", seed=0, strategy="random")
    c = tune("rmsnorm", "4x128", "float32", seed=1)
    assert a["golden"]["digest"] == b["golden"]["digest"] != c["golden"]["digest"]
    assert (a["strategy"], b["strategy"]) == ("exhaustive", "random")


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: s.name)
def test_every_catalog_kernel_tunes_on_cpu(spec: KernelSpec):
    shape = spec.test_shapes[0] if spec.test_shapes else spec.shapes["decode"][0]
    dtype = "float16" if "float16" in spec.dtypes else spec.dtypes[0]
    report = tune(spec.name, "x".join(map(str, shape)), dtype)
    assert report_problems(report) == []
    assert report["env"]["kernel_hash"] == spec.version and report["trials"][0]["status"] == "ok"


def test_bad_input_raises_clear_errors():
    with pytest.raises(UnknownKernel, match="unknown kernel 'nope'; known kernels: .*rmsnorm"):
        tune("nope", "8x256", "float16")
    with pytest.raises(BadShape, match="malformed shape"):
        tune("rmsnorm", "8by256", "float16")
    with pytest.raises(UnsupportedDtype, match="does not support dtype 'int8'"):
        tune("rmsnorm", "8x256", "int8")


# --- a composed spec on a backend that accepts custom candidates (MLX compositions on the CPU)


def _build(config, backend, shape, dtype):
    v = config["v"]
    if v == "broken":
        raise KernelBuildError("error: use of undeclared identifier 'tid'")
    if v == "wrong":
        return lambda xs: [xs[0] + 1]
    n = int(v)
    return lambda xs: [mx.exp(sum([xs[0]] * n) / n)]


def composed_spec(variants: tuple[str, ...], builtin=lambda xs: [mx.exp(xs[0])]) -> KernelSpec:
    def inputs(shape, dtype, seed):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        return [mx.array(x).astype(mx.float16)]
    return KernelSpec(
        name="exp", description="exp(x)", dtypes=("float16",), shape_doc="rows x cols",
        shapes={"decode": [(1, 64)], "large": [(64, 64)]}, make_inputs=inputs,
        reference=lambda xs: [mx.exp(xs[0].astype(mx.float32))], builtin=builtin,
        space=lambda s, d: [{"v": v} for v in variants], build=_build,
        tolerances={"float16": Tolerance(1e-2, 1e-2)}, bytes_moved=lambda s, d: 4 * s[0] * s[1],
        version="exp-1")


class Composed(Backend):
    name = "cpu"
    supports_custom_kernels = True

    @property
    def kernel_backend(self) -> str:
        # the spec's custom candidates are MLX compositions: offer them as a GPU backend would
        return "cuda"

    def available(self) -> bool:
        return True

    @property
    def device(self) -> mx.Device:
        return mx.Device(mx.cpu)


@pytest.mark.parametrize("strategy", ["halving", "exhaustive", "random"])
def test_failures_are_reported_and_best_never_slower_than_builtin(strategy):
    out = tune_spec(composed_spec(("1", "2", "8", "16", "broken", "wrong")), "32x256", "float16",
                    strategy=strategy, backend=Composed())
    r = out.report
    assert report_problems(r) == []
    by_key = {t["config_key"]: t for t in r["trials"]}
    assert by_key["v=broken"]["status"] == "compile_error" and "undeclared" in by_key["v=broken"]["error"]
    assert by_key["v=wrong"]["status"] == "mismatch" and by_key["v=wrong"]["max_abs_err"] > 0.5
    best = by_key[r["best_config_key"]]
    assert best["status"] == "ok" and best["median_us"] <= by_key["builtin"]["median_us"]
    assert out.measure_s > 0 and out.prepare_s > 0


def test_all_failed_raises():
    spec = composed_spec(("broken", "wrong"), builtin=lambda xs: [xs[0] * 0])  # a wrong built-in too
    for strategy in ("halving", "exhaustive", "random"):
        with pytest.raises(AllCandidatesFailed, match="all 3 candidates failed.*builtin: mismatch"):
            tune_spec(spec, "8x64", "float16", backend=Composed(), strategy=strategy)
