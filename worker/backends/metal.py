"""Apple-silicon GPUs through MLX's Metal backend (custom kernels via mx.fast.metal_kernel)."""

from __future__ import annotations

import re

import mlx.core as mx

from kernelfleet.worker.backends.base import Backend

# mlx/backend/metal/custom_kernel.cpp raises this std::invalid_argument (Python: ValueError) at launch
# when the threadgroup exceeds the compiled pipeline's maxTotalThreadsPerThreadgroup. That limit is
# below 1024 for register-heavy kernels and differs by chip (896 was reported on an M2 Ultra).
THREADGROUP_TOO_LARGE = re.compile(r"Thread group size \((\d+)\) is greater than\s+the maximum allowed "
                                   r"threads per threadgroup \((\d+)\)")


def threadgroup_limit_reason(error: BaseException) -> str | None:
    """The ``unsupported`` reason for MLX's threadgroup-too-large error (None for anything else)."""
    m = THREADGROUP_TOO_LARGE.search(str(error))
    if m is None:
        return None
    return (f"unsupported on this chip: threadgroup of {m.group(1)} threads is over this pipeline's "
            f"maxTotalThreadsPerThreadgroup of {m.group(2)}")


class MetalBackend(Backend):
    name = "metal"
    supports_custom_kernels = True

    def available(self) -> bool:
        return bool(mx.metal.is_available())

    def unsupported_reason(self, error: BaseException) -> str | None:
        return threadgroup_limit_reason(error)
