"""The registry of catalog kernels: one module per kernel (``<name>_kernel.py``, so it never shadows
the public function ``kernelfleet.kernels.<name>``), each exporting ``SPEC``."""

from __future__ import annotations

import importlib
from functools import cache

from .spec import KernelSpec, UnknownKernel

NAMES: tuple[str, ...] = (
    "rmsnorm",
    "add_rmsnorm",
    "layernorm",
    "softmax",
    "logsumexp",
    "swiglu",
    "geglu",
    "rope",
    "bias_gelu",
    "topk_gating_softmax",
    "moe_combine",
    "int4_dequantize",
)


@cache
def get_spec(name: str) -> KernelSpec:
    if name not in NAMES:
        raise UnknownKernel(f"unknown kernel {name!r}; known kernels: {', '.join(NAMES)}")
    module = importlib.import_module(f"{__package__}.{name}_kernel")
    spec: KernelSpec = module.SPEC
    return spec


def all_specs() -> list[KernelSpec]:
    return [get_spec(n) for n in NAMES]
