"""NVIDIA GPUs through MLX's CUDA backend (custom kernels via mx.fast.cuda_kernel)."""

from __future__ import annotations

import mlx.core as mx

from kernelfleet.worker.backends.base import Backend


class CudaBackend(Backend):
    name = "cuda"
    supports_custom_kernels = True

    def available(self) -> bool:
        cuda = getattr(mx, "cuda", None)
        return bool(cuda is not None and cuda.is_available())
