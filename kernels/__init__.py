"""The KernelFleet kernels. ``from kernelfleet.kernels import rmsnorm; rmsnorm(x, w)`` runs the best
known config for this chip (or the MLX built-in where custom kernels cannot run).

- ``spec``: the KernelSpec contract every kernel source meets; ``common``: dtype names, seeded
  inputs and shape checks shared by the kernel sources;
- ``render/``: the dialect, rendered for Metal and CUDA and launched through ``mx.fast``;
- ``catalog/``: our kernels, one module each, and the registry (:func:`get_spec`);
- ``zmlx/``: zmlx's kernels as a second catalog source;
- ``patch/``: profiles, the per-call config choice, and :func:`kernelfleet.patch`;
- ``testing/``: Metal without a Mac (strict MSL compile model, CPU emulator), for tests;
- ``api``: one public function per catalog kernel, re-exported here.

Imports run one way: ``spec``/``common`` <- ``render``, ``zmlx`` <- ``catalog`` <- ``patch`` <- ``api``
(checked by tests/test_import_graph.py).
"""

from .api import (
    add_rmsnorm,
    bias_gelu,
    gather_quantized_matmul,
    geglu,
    int4_dequantize,
    layernorm,
    logsumexp,
    moe_combine,
    quantized_matmul,
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
    "gather_quantized_matmul",
    "geglu",
    "get_spec",
    "int4_dequantize",
    "layernorm",
    "logsumexp",
    "moe_combine",
    "quantized_matmul",
    "rmsnorm",
    "rope",
    "softmax",
    "swiglu",
    "topk_gating_softmax",
]
