"""The KernelFleet kernel catalog: specs, dialect rendering, and runtime functions.

``from kernelfleet.kernels import rmsnorm; rmsnorm(x, w)`` runs the best known config for this
chip (or the MLX built-in where custom kernels cannot run).
"""

from .api import (
    add_rmsnorm,
    bias_gelu,
    geglu,
    int4_dequantize,
    layernorm,
    logsumexp,
    moe_combine,
    rmsnorm,
    rope,
    softmax,
    swiglu,
    topk_gating_softmax,
)
from .catalog import NAMES, all_specs, get_spec

__all__ = [
    "NAMES",
    "add_rmsnorm",
    "all_specs",
    "bias_gelu",
    "geglu",
    "get_spec",
    "int4_dequantize",
    "layernorm",
    "logsumexp",
    "moe_combine",
    "rmsnorm",
    "rope",
    "softmax",
    "swiglu",
    "topk_gating_softmax",
]
