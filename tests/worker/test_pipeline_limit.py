"""Metal's per-pipeline thread limit: MLX raises ValueError("Thread group size (N) is greater than
the maximum allowed threads per threadgroup (M).") at launch when a threadgroup exceeds the compiled
pipeline's maxTotalThreadsPerThreadgroup (below 1024 for register-heavy kernels; 896 reported on an
M2 Ultra). Such a config is ``unsupported`` on that chip, with the limit -- not a launch error --
and the search and the profile treat it as absent.

No Mac here: the launches run on the Metal emulator (kernels/testing), whose backend raises MLX's
exact message (mlx/backend/metal/custom_kernel.cpp) for a threadgroup over the modelled limit."""

from __future__ import annotations

import pytest

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.spec import config_key
from kernelfleet.kernels.testing.msl_clang import clang_path
from kernelfleet.service.schemas import TuningReport
from kernelfleet.worker.backends.metal import MetalBackend, threadgroup_limit_reason
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend
from kernelfleet.worker.report import report_problems
from kernelfleet.worker.tuner import tune_spec

MLX_ERROR = ("Thread group size (1024) is greater than  the maximum allowed threads per threadgroup "
             "(896).")


def test_mlx_threadgroup_error_is_unsupported_with_its_limit() -> None:
    reason = MetalBackend().unsupported_reason(ValueError(MLX_ERROR))
    assert reason is not None and "1024" in reason and "896" in reason
    assert threadgroup_limit_reason(ValueError("[metal_kernel] Expected `inputs` to have size 2")) is None
    assert threadgroup_limit_reason(RuntimeError("Unable to build metal library from source")) is None


@pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (the Metal emulator needs it)")
def test_tuning_records_unsupported_configs_and_never_picks_them() -> None:
    spec = get_spec("rmsnorm")
    shape, dtype = spec.test_shapes[0], "float32"
    configs = [c for c in spec.space(shape, dtype)
               if c["vec"] == 1 and c["rpg"] == 1 and c["tg"] in (256, 512, 1024) and "hint" not in c]
    assert {c["tg"] for c in configs} == {256, 512, 1024}
    backend = MetalEmuBackend(max_threads_per_threadgroup=896)  # an M2 Ultra's limit for this pipeline
    backend.prepare(spec, [shape], dtype, configs)
    outcome = tune_spec(spec, shape, dtype, strategy="exhaustive", backend=backend, configs=configs)
    report = outcome.report
    by_key = {t["config_key"]: t for t in report["trials"]}
    too_big = [config_key(c) for c in configs if c["tg"] > 896]
    assert too_big
    for key in too_big:
        t = by_key[key]
        assert t["status"] == "unsupported", t
        assert "896" in t["error"] and t["median_us"] is None and t["n"] == 0
    assert all(by_key[config_key(c)]["status"] == "ok" for c in configs if c["tg"] <= 896)
    assert report["best_config_key"] not in too_big  # the search never picks one
    report["env"]["backend"] = "metal"  # as a Mac's worker sends it (the emulator's name is metal-emu)
    assert report_problems(report) == []
    stored = TuningReport.model_validate(report)  # the coordinator's schema accepts the status
    assert [t.status for t in stored.trials].count("unsupported") == len(too_big)
