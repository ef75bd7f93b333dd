"""The registry of catalog kernels: one module per kernel (``<name>_kernel.py``, so it never shadows
the public function ``kernelfleet.kernels.<name>``), each exporting ``SPEC``."""

from __future__ import annotations

import importlib
import importlib.util
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


def available_names() -> tuple[str, ...]:
    """The names whose modules exist (all of :data:`NAMES` once the catalog is complete)."""
    return tuple(n for n in NAMES if importlib.util.find_spec(f"{__package__}.{n}_kernel") is not None)


@cache
def get_spec(name: str) -> KernelSpec:
    if name not in available_names():
        raise UnknownKernel(f"unknown kernel {name!r}; known kernels: {', '.join(available_names())}")
    module = importlib.import_module(f"{__package__}.{name}_kernel")
    spec: KernelSpec = module.SPEC
    return spec


def all_specs() -> list[KernelSpec]:
    return [get_spec(n) for n in available_names()]
