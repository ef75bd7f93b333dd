"""The kernel page's default dtype: the one most GPU chips measured, not one only the CPU has."""

from __future__ import annotations

from datetime import UTC, datetime

from kernelfleet.web.kernel import default_dtype
from kernelfleet.web.series import Latest


def run(chip: str, dtype: str) -> Latest:
    return Latest(result_id=1, chip=chip, kernel="layernorm", shape="32x4096", dtype=dtype, config_key=None,
                  is_builtin=True, best_us=10.0, builtin_us=10.0, mlx_version="0.32.4",
                  created_at=datetime(2026, 11, 26, tzinfo=UTC))


def test_a_dtype_only_the_cpu_has_is_not_the_default() -> None:
    latest = [run("cpu x86_64", "float16"), run("Apple M2", "float32"),
              run("NVIDIA H100 80GB HBM3", "float32")]
    assert default_dtype(latest, ["float16", "float32"]) == "float32"


def test_ties_go_to_float16_then_bfloat16() -> None:
    latest = [run("Apple M2", d) for d in ("float32", "bfloat16", "float16")]
    assert default_dtype(latest, ["bfloat16", "float16", "float32"]) == "float16"
    assert default_dtype(latest[:2], ["bfloat16", "float32"]) == "bfloat16"
    assert default_dtype([run("cpu", "float32")], ["float32"]) == "float32"
