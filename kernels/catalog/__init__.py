"""The catalog: the kernels KernelFleet tunes, and their registry.

One module per kernel (``<name>_kernel.py``, so it never shadows the public function
``kernelfleet.kernels.<name>``), each exporting ``SPEC``; the families' shared parameter spaces and
geometry (``rowwise``, ``elementwise``, ``gated``) and MLX's affine quantization format (``affine``).
Their bodies are written in the dialect and rendered by :mod:`kernelfleet.kernels.render`.

A second kernel source, zmlx's own kernels (:mod:`kernelfleet.kernels.zmlx.family`, names ``zmlx_*``),
is looked up by :func:`get_spec` too; :data:`NAMES` and :func:`all_specs` stay our own kernels (rendered
from the dialect for Metal and CUDA), :data:`ZMLX_NAMES` / :func:`zmlx_specs` are zmlx's (Metal only)."""

from __future__ import annotations

import importlib
from functools import cache

from ..spec import KernelSpec, UnknownKernel
from ..zmlx import family as zmlx_family

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
    "quantized_matmul",
    "gather_quantized_matmul",
)


ZMLX_NAMES: tuple[str, ...] = zmlx_family.NAMES


@cache
def get_spec(name: str) -> KernelSpec:
    if name in ZMLX_NAMES:
        return zmlx_family.spec(name)
    if name not in NAMES:
        raise UnknownKernel(f"unknown kernel {name!r}; known kernels: {', '.join(NAMES + ZMLX_NAMES)}")
    module = importlib.import_module(f"{__package__}.{name}_kernel")
    spec: KernelSpec = module.SPEC
    return spec


def all_specs() -> list[KernelSpec]:
    return [get_spec(n) for n in NAMES]


def zmlx_specs() -> list[KernelSpec]:
    return [get_spec(n) for n in ZMLX_NAMES]
