"""The memory limit the benchmarks hold results to: device-to-device copy bandwidth, measured.

Imports only mlx (``benchmarks/model.py`` runs on a bare GPU host). ``benchmarks/kernels.py`` adds
torch's copy on CUDA where torch is installed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

_COPY_CUDA = """
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < N) {
        reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(inp)[i];
    }
"""
_COPY_METAL = """
    uint i = thread_position_in_grid.x;
    if (i < N) {
        reinterpret_cast<device uint4*>(out)[i] = reinterpret_cast<device const uint4*>(inp)[i];
    }
"""


def time_fn(fn: Any, launches: int = 20, rounds: int = 15) -> float:
    """Median seconds per launch: rounds of ``launches`` async launches between synchronizations."""
    mx.eval(fn())
    mx.synchronize()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(launches):
            mx.async_eval(fn())
        mx.synchronize()
        samples.append((time.perf_counter() - t0) / launches)
    return float(sorted(samples)[len(samples) // 2])


def copy_kernel(backend: str) -> Callable[[mx.array], mx.array]:
    """A device-to-device copy by a custom kernel (16 bytes per thread; ``x.nbytes`` a multiple
    of 16), for the ``cuda`` or ``metal`` backend: the bandwidth the table's kernels are held to."""
    make: Any = mx.fast.cuda_kernel if backend == "cuda" else mx.fast.metal_kernel
    kernel = make(name="kf_bench_copy", input_names=["inp"], output_names=["out"],
                  source=_COPY_CUDA if backend == "cuda" else _COPY_METAL)

    def copy(x: mx.array) -> mx.array:
        n16 = x.nbytes // 16
        return kernel(inputs=[x], template=[("N", n16)], grid=(n16, 1, 1), threadgroup=(256, 1, 1),
                      output_shapes=[x.shape], output_dtypes=[x.dtype])[0]

    return copy


def copy_bandwidth(backend: str, nbytes: int = 1 << 30) -> dict[str, float]:
    """Measured device-to-device copy bandwidth in GB/s (read + write counted): the custom copy
    kernel's (GPU) and MLX's ``x + 0``; ``limit`` the best of them."""
    n = nbytes // 4
    x = mx.random.uniform(shape=(n,), dtype=mx.float32)
    mx.eval(x)
    out: dict[str, float] = {}
    if backend in ("cuda", "metal"):
        copy = copy_kernel(backend)
        check = copy(x)
        mx.eval(check)
        if bool(mx.array_equal(check, x).item()):
            out["copy_kernel"] = 2 * nbytes / time_fn(lambda: copy(x)) / 1e9
    launches = 20 if backend in ("cuda", "metal") else 2
    out["mlx_x_plus_0"] = 2 * nbytes / time_fn(lambda: x + 0, launches=launches, rounds=5) / 1e9
    out["limit"] = max(out.values())
    return out
