"""MLX's CPU backend: no custom kernels exist there, so only the built-in (and mx.compile'd
compositions, which the specs expose as their built-in) run."""

from __future__ import annotations

import mlx.core as mx

from kernelfleet.worker.backends.base import Backend


class CpuBackend(Backend):
    name = "cpu"
    supports_custom_kernels = False

    def available(self) -> bool:
        return True

    @property
    def device(self) -> mx.Device:
        return mx.Device(mx.cpu)
