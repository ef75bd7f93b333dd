"""Rebuild the translation units MLX would compile for a captured launch.

Mirrors ``write_signature`` (mlx/fast.cpp, Metal) and ``build_kernel``
(mlx/backend/cuda/custom_kernel.cpp) of MLX 0.32: same parameter order and types, attribute
parameters only for attribute names found in the body, template arguments as a function
template (Metal) or ``constexpr``/``using`` lines (CUDA).
"""

from __future__ import annotations

import re

import mlx.core as mx

from kernelfleet.kernels.launch import LaunchRecord

METAL_TYPES = {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t",
               mx.uint32: "uint32_t", mx.int32: "int32_t", mx.uint8: "uint8_t"}
CUDA_TYPES = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
              mx.uint32: "uint32_t", mx.int32: "int32_t", mx.uint8: "uint8_t"}

METAL_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]


def _template_value(value: object, types: dict[mx.Dtype, str]) -> tuple[str, str]:
    if isinstance(value, bool):
        return "bool", "true" if value else "false"
    if isinstance(value, int):
        return "int", str(value)
    return "typename", types[value]  # type: ignore[index]


def metal_unit(records: list[tuple[LaunchRecord, str]]) -> str:
    """One MSL file: each distinct header once, then every kernel function (and instantiation)."""
    headers: list[str] = []
    for rec, _ in records:
        if rec.rendered.header not in headers:
            headers.append(rec.rendered.header)
    return '#include "metal_stub.h"\n' + "".join(headers) + "".join(metal_function(r, n) for r, n in records)


def metal_function(rec: LaunchRecord, func_name: str) -> str:
    r = rec.rendered
    src = r.source
    parts = []
    tmpl = [(name, *_template_value(v, METAL_TYPES)) for name, v in rec.launch.template]
    if tmpl:
        parts.append("template <" + ", ".join(f"{kind} {name}" for name, kind, _ in tmpl) + ">\n")
    params = []
    index = 0
    for name, dt, shape in zip(r.inputs, rec.input_dtypes, rec.input_shapes, strict=True):
        size = 1
        for d in shape:
            size *= d
        location = "constant" if size < 8 else "device"
        ref = "&" if len(shape) == 0 else "*"
        params.append(f"  const {location} {METAL_TYPES[dt]}{ref} {name} [[buffer({index})]]")
        index += 1
        if shape:
            if f"{name}_shape" in src:
                params.append(f"  const constant int* {name}_shape [[buffer({index})]]")
                index += 1
            if f"{name}_strides" in src:
                params.append(f"  const constant int64_t* {name}_strides [[buffer({index})]]")
                index += 1
            if f"{name}_ndim" in src:
                params.append(f"  const constant int& {name}_ndim [[buffer({index})]]")
                index += 1
    for name, dt in zip(r.outputs, rec.output_dtypes, strict=True):
        params.append(f"  device {METAL_TYPES[dt]}* {name} [[buffer({index})]]")
        index += 1
    for attr, kind in METAL_ATTRIBUTES:
        if attr in src:
            params.append(f"  {kind} {attr} [[{attr}]]")
    parts.append(f"[[kernel]] void {func_name}(\n" + ",\n".join(params) + ") {\n" + src + "\n}\n")
    if tmpl:
        args = "<" + ", ".join(v for _, _, v in tmpl) + ">"
        parts.append(f'template [[host_name("{func_name}")]] [[kernel]] decltype({func_name}{args}) '
                     f"{func_name}{args};\n")
    return "".join(parts)


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


def cuda_unit(records: list[tuple[LaunchRecord, str]]) -> str:
    """One .cu file: MLX's default header, each distinct header once, then every function."""
    headers: list[str] = []
    for rec, _ in records:
        if rec.rendered.header not in headers:
            headers.append(rec.rendered.header)
    return CUDA_DEFAULT_HEADER + "".join(headers) + "".join(cuda_function(rec, n) for rec, n in records)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)
