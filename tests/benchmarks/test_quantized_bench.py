"""benchmarks/quantized.py's config selection: ``--paths`` and ``--where`` pick the configs a run (timed or
under ``--ncu``) takes from the spec's space, an optional axis a config lacks reading as 0."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quantized  # noqa: E402

from kernelfleet.kernels.catalog import get_spec  # noqa: E402


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"configs": "all", "paths": None, "where": None, **kw})


def test_where_picks_axis_values() -> None:
    spec = get_spec("quantized_matmul")
    shape = (1, 4096, 14336, 4, 64)
    every = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args(paths="qmv_split"))
    picked = quantized.our_configs(spec, shape, "bfloat16", "cuda",
                                   _args(paths="qmv_split", where="rpw=8,vw=4,tg=64|128"))
    assert picked == [c for c in every if c["rpw"] == 8 and c["vw"] == 4 and c["tg"] in (64, 128)]
    assert {c["tg"] for c in picked} == {64, 128}


def test_where_reads_an_optional_axis_a_config_lacks_as_zero() -> None:
    """swiglu's frontier axes (hint, fm) appear only away from 0: hint=0 is the configs without it."""
    spec = get_spec("swiglu")
    shape = spec.shapes["large"][0]
    every = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args())
    plain = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args(where="hint=0"))
    hinted = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args(where="hint=1"))
    assert plain == [c for c in every if "hint" not in c] and plain
    assert hinted == [c for c in every if c.get("hint") == 1] and hinted
    assert len(plain) + len(hinted) <= len(every)


@pytest.mark.parametrize("bad", ["rpw", "=4", "rpw=", "rpw=4,,vw=4"])
def test_where_refuses_what_is_not_axis_equals_values(bad: str) -> None:
    with pytest.raises(SystemExit, match="--where"):
        quantized.parse_where(bad)


def _launch(us: float, mb: float, name: str = "custom_kernel_kf_qmv_1", grid: str = "(8, 1, 1)"
            ) -> list[object]:
    from ncu import Kernel

    return [Kernel(name, us, mb, grid, "(64, 1, 1)")]


def test_ncu_rows_put_each_config_beside_mlx_and_the_read_floor() -> None:
    """A shape's ncu lines: each contender's median later launch (the first dropped), the best configs
    with MLX's op and the read floor, fastest first; mlx/x and floor/x are their times over the row's."""
    runs = {
        "path=qmv,rpw=8": [_launch(900.0, 3.0), _launch(20.0, 33.0), _launch(22.0, 33.0),
                           _launch(24.0, 33.0)],
        "path=qmv,rpw=4": [_launch(25.0, 33.0), _launch(25.0, 33.0)],
        "path=qmv,rpw=2": [_launch(40.0, 33.0), _launch(40.0, 33.0)],
        "builtin": [_launch(44.0, 33.0, "qmv_kernel<8>")] * 3,
        "floor": [_launch(11.0, 33.0, "custom_kernel_kf_read_floor", "(2016, 1, 1)")] * 3,
    }
    lines = quantized.ncu_rows("quantized_matmul", "1x4096x14336x4x64", runs, 2, 4000.0)
    labels = [line[25:65].strip() for line in lines]
    assert labels == [quantized.FLOOR_LABEL, "path=qmv,rpw=8", "path=qmv,rpw=4",
                      "mlx quantized_matmul (built-in)"]  # rpw=2 is not among the 2 best
    qmv8 = lines[1].split()
    # median of the later launches (22 of 20, 22, 24), 33 MB in 22 us = 1500 GB/s = 38 % of 4000
    assert qmv8[2:6] == ["22.00", "33.00", "1500", "38%"]
    assert qmv8[6:8] == ["2.00x", "0.50x"]  # MLX 44 / 22; floor 11 / 22
    assert lines[0].split()[-6:-4] == ["4.00x", "1.00x"] and lines[0].endswith("grid (2016, 1, 1)")


def test_read_floor_source_compiles_with_nvcc(tmp_path: Path) -> None:
    """The read floor's body, wrapped as MLX's cuda_kernel wraps it (template constants, the inputs' and
    output's pointers), compiles for sm_90: it only runs on a GPU host, so this is its check here."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc") or next((str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")), None)
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    unit = ("#include <cstdint>\n#include <cstddef>\n#include <cuda_bf16.h>\n"
            "template <int NW, int NS> __global__ void read_floor(const uint32_t* wq, "
            "const __nv_bfloat16* scales, const __nv_bfloat16* biases, uint32_t* out) {"
            + quantized.FLOOR_SOURCE + "}\n"
            "template __global__ void read_floor<1835008, 114688>(const uint32_t*, const __nv_bfloat16*, "
            "const __nv_bfloat16*, uint32_t*);\n")
    src = tmp_path / "floor.cu"
    src.write_text(unit)
    done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", "-o", str(tmp_path / "floor.o"),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_read_floor_takes_only_whole_16_byte_words() -> None:
    """A small shape's scales (8 bytes a row here) are no whole 16-byte words: the floor is left out
    there (the ncu run goes on without it), and a direct call says why."""
    spec = get_spec("quantized_matmul")
    assert quantized.floor_fits(spec.make_inputs((1, 4096, 64, 4, 64), "bfloat16", 0))
    small = spec.make_inputs((1, 256, 3, 4, 64), "bfloat16", 0)
    assert not quantized.floor_fits(small)
    with pytest.raises(ValueError, match="16-byte"):
        quantized.read_floor(small)
