"""Rendered CUDA kernels (each kernel x dtype, configs covering every template value), wrapped the way
MLX's cuda_kernel wraps it, compile with the installed nvcc (sm_90, real code generation)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from sampling import covered, rotating

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.render.launch import LaunchRecord

from .capture import records
from .mlx_sources import cuda_unit

STUB = Path(__file__).parent / "cuda_stub"
NVCC = shutil.which("nvcc") or next((str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")), None)


def _representative(recs: list[tuple[LaunchRecord, str]]) -> list[tuple[LaunchRecord, str]]:
    """nvcc does full code generation (seconds per kernel): compile one config per distinct value of
    every template parameter other than the element type (the Metal check covers every config)."""
    seen: set[tuple[str, object]] = set()
    out = []
    for rec, name in recs:
        keys = {(k, str(v)) for k, v in rec.launch.template}
        if not keys <= seen:
            seen |= keys
            out.append((rec, name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_sources_compile_with_nvcc(name: str, tmp_path: Path) -> None:
    spec = get_spec(name)
    every = [r for dtype in spec.dtypes for r in _representative(records(spec, "cuda", dtype))]
    assert every
    # a sixth of them a day (nvcc takes ~1 s a kernel on this host: 190 s a suite at a third; six days
    # compile every one), all under make test-full
    recs = rotating(every, -(-len(every) // 6), f"nvcc-{name}")
    print(covered(f"{name} CUDA kernels compiled by nvcc", len(recs), len(every)))
    path = tmp_path / f"{name}.cu"
    path.write_text(cuda_unit(recs))
    proc = subprocess.run(
        [str(NVCC), "-std=c++17", "-arch=sm_90", f"-I{STUB}", "-x", "cu", "-c", "-o", str(tmp_path / "k.o"),
         str(path)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"{name}: CUDA does not compile:\n{proc.stderr[:4000]}"
    for rec, _ in recs:
        src = rec.rendered.source
        assert "thread_position_in" not in src and "threadgroup_barrier" not in src
