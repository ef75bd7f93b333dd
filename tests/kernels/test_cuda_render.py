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


def _nvcc(unit: str, path: Path) -> subprocess.CompletedProcess[str]:
    path.write_text(unit)
    return subprocess.run(
        [str(NVCC), "-std=c++17", "-arch=sm_90", f"-I{STUB}", "-x", "cu", "-c",
         "-o", str(path.with_suffix(".o")), str(path)],
        capture_output=True, text=True, timeout=900,
    )


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_cuda_sources_compile_with_nvcc(tmp_path: Path) -> None:
    """Every catalog kernel's sampled configs in one translation unit, so that nvcc's fixed cost per
    unit (host compiler, MLX's headers) is paid once: on this 2-core host a unit of one kernel's 7
    configs took 3.4 s, 16 such units 133 s of a loaded suite, and one unit of all 16 kernels' 185
    configs (a third of each) 11 s. On a failure each kernel is compiled alone, to name the ones
    that fail."""
    picked: dict[str, list[tuple[LaunchRecord, str]]] = {}
    for name in NAMES:
        spec = get_spec(name)
        every = [r for dtype in spec.dtypes for r in _representative(records(spec, "cuda", dtype))]
        assert every, name
        # a third of them a day (three days compile every one), all under make test-full
        picked[name] = rotating(every, -(-len(every) // 3), f"nvcc-{name}")
        print(covered(f"{name} CUDA kernels compiled by nvcc", len(picked[name]), len(every)))
        for rec, _ in picked[name]:
            src = rec.rendered.source
            assert "thread_position_in" not in src and "threadgroup_barrier" not in src, name
    # function names are unique within one kernel and dtype (capture.records); renumbered across all
    every_rec = [(rec, f"{rec.rendered.name}_{i}")
                 for i, (rec, _) in enumerate(r for recs in picked.values() for r in recs)]
    proc = _nvcc(cuda_unit(every_rec), tmp_path / "catalog.cu")
    if proc.returncode == 0:
        return
    failing = {name: err for name, recs in picked.items()
               if (err := _nvcc(cuda_unit(recs), tmp_path / f"{name}.cu")).returncode != 0}
    detail = "\n".join(f"--- {name}:\n{p.stderr[:3000]}" for name, p in failing.items())
    pytest.fail(f"CUDA does not compile: {sorted(failing) or 'only together'}\n"
                f"{detail or proc.stderr[:4000]}")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_cuda_sources_compile_as_launched(tmp_path: Path) -> None:
    """Each CUDA kernel's header holds only the prelude's helpers it uses (``dialect.prelude_for``), so a
    kernel compiles with the part it was given, as MLX compiles it, and not only beside the whole
    prelude: per kernel family one unit of its kernels that share a header (a few families a day,
    every one under make test-full)."""
    groups: dict[tuple[str, str], list[tuple[LaunchRecord, str]]] = {}
    for name in NAMES:
        spec = get_spec(name)
        for rec, fn in _representative(records(spec, "cuda", spec.dtypes[0])):
            groups.setdefault((name, rec.rendered.header), []).append((rec, fn))
    picked = rotating(sorted(groups), 3, "nvcc-as-launched")
    print(covered("CUDA kernel headers compiled as launched", len(picked), len(groups)))
    for key in picked:
        proc = _nvcc(cuda_unit(groups[key][:4], as_launched=True), tmp_path / "unit.cu")
        assert proc.returncode == 0, f"{key[0]}: {proc.stderr[:3000]}"
