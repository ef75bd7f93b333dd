"""Rebuild the translation unit MLX's CUDA backend would compile for a captured launch.

Mirrors ``build_kernel`` (mlx/backend/cuda/custom_kernel.cpp) of MLX 0.32: same parameter order and
types, template arguments as ``constexpr``/``using`` lines. (Metal: kernelfleet.kernels.testing.
mlx_metal.)
"""

from __future__ import annotations

import re

import mlx.core as mx

from kernelfleet.kernels.render.dialect import prelude
from kernelfleet.kernels.render.launch import LaunchRecord

CUDA_TYPES = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
              mx.uint32: "uint32_t", mx.int32: "int32_t", mx.uint8: "uint8_t"}


def _template_value(value: object, types: dict[mx.Dtype, str]) -> tuple[str, str]:
    if isinstance(value, bool):
        return "bool", "true" if value else "false"
    if isinstance(value, int):
        return "int", str(value)
    return "typename", types[value]  # type: ignore[index]


CUDA_DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

#define inf cuda::std::numeric_limits<float>::infinity()

"""


def cuda_function(rec: LaunchRecord, func_name: str) -> str:
    """The ``namespace mlx::core::cu { __global__ ... }`` part (header not included)."""
    r = rec.rendered
    src = r.source
    lines = ["namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n",
             f"__global__ void {func_name}(\n"]
    params = []
    for name, dt, shape in zip(r.inputs, rec.input_dtypes, rec.input_shapes, strict=True):
        params.append(f"    const {CUDA_TYPES[dt]}* {name}")
        if shape:
            if f"{name}_shape" in src:
                params.append(f"    const __grid_constant__ Shape {name}_shape")
            if f"{name}_strides" in src:
                params.append(f"    const __grid_constant__ Strides {name}_strides")
            if f"{name}_ndim" in src:
                params.append(f"    const __grid_constant__ int {name}_ndim")
    for name, dt in zip(r.outputs, rec.output_dtypes, strict=True):
        params.append(f"    {CUDA_TYPES[dt]}* {name}")
    lines.append(",\n".join(params) + ") {\n")
    for name, value in rec.launch.template:
        kind, text = _template_value(value, CUDA_TYPES)
        lines.append(f"  using {name} = {text};\n" if kind == "typename"
                     else f"  constexpr {kind} {name} = {text};\n")
    lines.append("\n" + src + "\n}\n\n} // namespace mlx::core::cu\n")
    return "".join(lines)


def cuda_unit(records: list[tuple[LaunchRecord, str]], as_launched: bool = False) -> str:
    """One .cu file: MLX's default header, the dialect's whole prelude and each kernel's own helpers once,
    then every function (MLX compiles each kernel alone, with the prelude's part it uses: that part
    compiles alone in ``test_cuda_sources_compile_as_launched`` and on the GPU).

    With ``as_launched`` the records share one header, which comes as MLX gets it: the prelude's part
    they use, then their own helpers."""
    if as_launched:
        headers = list(dict.fromkeys(rec.rendered.header for rec, _ in records))
        assert len(headers) == 1, "as_launched: the records' headers differ"
    else:
        headers = [prelude("cuda")]
        for rec, _ in records:
            if rec.rendered.own_header not in headers:
                headers.append(rec.rendered.own_header)
    return CUDA_DEFAULT_HEADER + "".join(headers) + "".join(cuda_function(rec, n) for rec, n in records)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)
