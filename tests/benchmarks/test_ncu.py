"""benchmarks/ncu.py: Nsight Compute's raw CSV page (as ncu 2025 prints it on an H200: the program's output
and ncu's notes first, a units row under the header, thousands separators) read into kernels, and the
kernels split into one group per contender at the marker kernels."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import ncu  # noqa: E402

HEAD = ('"ID","Process ID","Kernel Name","Block Size","Grid Size","dram__bytes_read.sum",'
        '"gpu__time_duration.sum"')
UNITS = '"","","","","","byte","ns"'


def row(i: int, name: str, nbytes: str, ns: str) -> str:
    return f'"{i}","1455","{name}","(64, 1, 1)","(768, 1, 1)","{nbytes}","{ns}"'


TEXT = "\n".join([
    "==PROF== Connected to process 1455 (/usr/bin/python3.12)",
    "NCU 8x2048x768x128x4x64 inputs",
    "==PROF== Disconnected from process 1455",
    HEAD, UNITS,
    row(0, "void mlx::core::cu::contiguous_scan<int, 4>(...)", "1,024", "2,100"),
    row(1, "void copy_v<float, __nv_bfloat16, unsigned int, 4>(const T1", "6,912", "1,436,224"),
    row(2, "void mlx::core::cu::contiguous_scan<int, 4>(...)", "1,024", "2,050"),
    row(3, "custom_kernel_kf_gather_qmv_0123abcd_4567", "7,130,000", "6,430"),
    row(4, "void mlx::core::cu::contiguous_scan<int, 4>(...)", "1,024", "2,000"),
    row(5, "custom_kernel_kf_dequant_89ab", "7,000,000", "3,000"),
    row(6, "sm90_xmma_gemm_bf16bf16_bf16f32", "14,000,000", "9,500"),
    row(7, "void cub::DeviceScanKernel<...>(...)", "1,024", "2,000"),  # CUB's, as a marker too
])


def test_the_kernels_come_in_launch_order_in_us_and_mb() -> None:
    kernels = ncu.parse(TEXT)
    assert [k.name[:12] for k in kernels] == ["void mlx::co", "void copy_v<", "void mlx::co", "custom_kerne",
                                              "void mlx::co", "custom_kerne", "sm90_xmma_ge", "void cub::De"]
    qmv = kernels[3]
    assert (qmv.us, qmv.mb, qmv.grid, qmv.block) == (6.43, 7.13, "(768, 1, 1)", "(64, 1, 1)")
    assert kernels[1].us == 1436.224


def test_markers_split_the_kernels_into_one_group_a_contender() -> None:
    """Three contenders (the inputs, one kernel, two kernels): their kernels without the markers."""
    found = ncu.groups(ncu.parse(TEXT))
    assert [[k.name[:24] for k in g] for g in found] == [["void copy_v<float, __nv_"],
                                                         ["custom_kernel_kf_gather_"],
                                                         ["custom_kernel_kf_dequant",
                                                          "sm90_xmma_gemm_bf16bf16_"]]
    # MLX names a custom kernel custom_kernel_<name>: the catalog's are told apart from MLX's own
    assert [[ncu.ours(k.name) for k in g] for g in found] == [[False], [True], [True, False]]
    assert sum(k.us for k in found[2]) == 12.5


def test_no_table_no_kernels() -> None:
    assert ncu.parse("==ERR== the program failed\n") == []
    assert ncu.groups([]) == []


def test_the_command_runs_the_program_under_ncu_with_caches_flushed_at_the_gpus_clocks() -> None:
    cmd = ncu.command("/usr/local/cuda/bin/ncu", ["python3", "x.py"])
    assert cmd[:3] == ["/usr/local/cuda/bin/ncu", "--clock-control", "none"]
    assert "--cache-control" not in cmd  # ncu's default flushes every cache before each kernel
    assert cmd[cmd.index("--metrics") + 1] == "gpu__time_duration.sum,dram__bytes_read.sum"
    assert cmd[-2:] == ["python3", "x.py"]


def test_a_contenders_time_is_its_median_launch_after_the_first() -> None:
    def launch(us: float) -> list[ncu.Kernel]:
        return [ncu.Kernel("custom_kernel_kf_qmv_0", us, 33.0, "(1792, 1, 1)", "(64, 1, 1)")]

    # the first launch (1393 us, as on the H200) is dropped; of 6.6 and 6.9 the lower middle
    assert ncu.median_launch([launch(1393.0), launch(6.9), launch(6.6)])[0].us == 6.6
    assert ncu.median_launch([launch(1393.0), launch(6.9), launch(6.6), launch(7.0)])[0].us == 6.9
    assert ncu.median_launch([launch(6.6)])[0].us == 6.6  # one launch: itself
