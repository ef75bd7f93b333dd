"""Nsight Compute (``ncu``) as the benchmarks run it: GPU time per kernel, caches flushed before each one.

Timing between synchronizations cannot see a decode-size kernel on a GPU host: the host's launch cost
(~20 µs with MLX's CUDA backend) bounds every such row, while the kernel itself runs in 5-25 µs. ncu
replays each kernel alone and reports its duration (``gpu__time_duration.sum``) and the DRAM bytes it read
(``dram__bytes_read.sum``), with every cache flushed first (its default ``--cache-control all``), at the
GPU's own clocks (``--clock-control none``).

A program run under it marks what it launches by a kernel of its own between contenders
(:data:`MARKER`, a prefix sum no contender runs), so the rows split into one group per contender
(:func:`groups`): a contender's time is the sum of its group's kernels (a dequantize and MLX's GEMM, say).

    from ncu import command, parse, groups
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum")
# MLX's prefix sum kernels (mx.cumsum: "contiguous_scan", or CUB's "DeviceScanKernel"), matched without
# case: the marker a program launches between contenders
MARKER = "scan"
# ncu's units -> µs and MB
SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "byte": 1e-6, "B": 1e-6, "Kbyte": 1e-3, "KB": 1e-3, "Mbyte": 1.0, "MB": 1.0, "Gbyte": 1e3, "GB": 1e3}


@dataclass(frozen=True)
class Kernel:
    name: str
    us: float  # GPU time
    mb: float  # DRAM bytes read, MB
    grid: str
    block: str


def ours(name: str) -> bool:
    """Whether a kernel is the catalog's: MLX names an ``mx.fast.cuda_kernel`` ``custom_kernel_<name>``,
    and every catalog kernel's name starts ``kf_``."""
    return name.startswith(("kf_", "custom_kernel_kf_"))


def find() -> str | None:
    """The ncu executable: on PATH, else CUDA's default place."""
    found = shutil.which("ncu")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/ncu")
    return str(default) if default.exists() and os.access(default, os.X_OK) else None


def command(ncu: str, program: list[str]) -> list[str]:
    """``program`` under ncu, its table on stdout as CSV after the program's own output."""
    return [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--metrics", ",".join(METRICS),
            *program]


def parse(text: str) -> list[Kernel]:
    """The kernels of ncu's raw CSV page in launch order (the lines before its header are the program's
    output and ncu's notes)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    head, units = rows[0], rows[1]
    col = {h: i for i, h in enumerate(head)}

    def value(row: list[str], metric: str) -> float:
        return float(row[col[metric]].replace(",", "")) * SCALE[units[col[metric]]]

    return [Kernel(r[col["Kernel Name"]], value(r, METRICS[0]), value(r, METRICS[1]), r[col["Grid Size"]],
                   r[col["Block Size"]]) for r in rows[2:] if len(r) == len(head)]


def groups(kernels: list[Kernel]) -> list[list[Kernel]]:
    """The kernels between consecutive markers (the first marker opens the first group)."""
    out: list[list[Kernel]] = []
    current: list[Kernel] | None = None
    for k in kernels:
        if MARKER in k.name.lower():
            if current is not None:
                out.append(current)
            current = []
        elif current is not None:
            current.append(k)
    return out


def median_launch(launches: list[list[Kernel]]) -> list[Kernel]:
    """Of a contender's launches (each its kernels), the one of median GPU time after the first, which is
    dropped where there are more (a first launch can read hundreds of times its later time)."""
    later = sorted(launches[1:] or launches, key=lambda ks: sum(k.us for k in ks))
    return later[(len(later) - 1) // 2]
