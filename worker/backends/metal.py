"""Apple-silicon GPUs through MLX's Metal backend (custom kernels via mx.fast.metal_kernel)."""

from __future__ import annotations

import mlx.core as mx

from kernelfleet.worker.backends.base import Backend


class MetalBackend(Backend):
    name = "metal"
    supports_custom_kernels = True

    def available(self) -> bool:
        return bool(mx.metal.is_available())
