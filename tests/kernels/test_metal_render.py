"""Metal checked off-Mac: every rendered MSL kernel (each kernel x dtype x config of its test
shapes) is wrapped in the signature MLX generates and compiled as C++ by g++ -fsyntax-only
against tests/kernels/metal_stub.h."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernelfleet.kernels.catalog import NAMES, get_spec

from .capture import records
from .mlx_sources import metal_unit

HERE = Path(__file__).parent
CXX = shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++ or clang++) on PATH")
@pytest.mark.parametrize("name", NAMES)
def test_metal_sources_compile_as_cpp(name: str, tmp_path: Path) -> None:
    spec = get_spec(name)
    for dtype in spec.dtypes:
        recs = records(spec, "metal", dtype)
        assert recs
        unit = metal_unit(recs)
        path = tmp_path / f"{name}_{dtype}.metal.cpp"
        path.write_text(unit)
        proc = subprocess.run(
            [str(CXX), "-std=c++17", "-fsyntax-only", "-Wno-attributes", "-Wno-unknown-pragmas",
             "-Werror=return-type", f"-I{HERE}", "-x", "c++", str(path)],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, f"{name} {dtype}: MSL does not compile:\n{proc.stderr[:4000]}"
        # MLX adds attribute parameters only for names in the body: the renderer must have spelled
        # the dialect's indices with Metal's attribute names, never with CUDA's.
        for rec, _ in recs:
            assert "threadIdx" not in rec.rendered.source and "__syncthreads" not in rec.rendered.source
