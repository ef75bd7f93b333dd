"""The exact MSL text MLX compiles for one ``mx.fast.metal_kernel`` launch (MLX 0.32).

Mirrors ``mlx/backend/common/metal_kernel.cpp``: the kernel name (``custom_kernel_<name>``, the
template values, one suffix per input and output dtype), ``write_signature`` (inputs first, each
``const constant`` when it has fewer than 8 elements else ``const device``, ``&`` for 0-d
arrays; ``<in>_shape`` / ``_strides`` / ``_ndim`` buffers only when the body mentions them;
outputs as ``device T*``; one attribute parameter for each attribute name found in the body) and
the explicit template instantiation. ``mlx/backend/metal/custom_kernel.cpp`` prepends
``metal::utils()``; here that is ``#include "msl.h"`` (the model of MSL plus what MLX's utils add).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

MAX_CONSTANT_ARRAY_SIZE = 8  # inputs with fewer elements are passed in the constant address space

TYPE_STRINGS: dict[mx.Dtype, str] = {  # get_type_string
    mx.bool_: "bool", mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t",
    mx.uint64: "uint64_t", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t",
    mx.int64: "int64_t", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.float32: "float",
}

ATTRIBUTES: tuple[tuple[str, str], ...] = (  # metal_attributes, in MLX's order
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
)


class MetalSourceError(ValueError):
    """A launch MLX would reject before compiling (a dtype Metal has no type for, ...)."""


@dataclass(frozen=True)
class Buffer:
    """One ``[[buffer(i)]]`` parameter, in binding order."""

    name: str
    kind: str  # "input", "shape", "strides", "ndim" or "output"
    ctype: str  # element type as written (float, bfloat16_t, int, int64_t ...)
    space: str  # "device" or "constant"
    scalar: bool = False  # passed by reference (a 0-d input, or an ndim)
    of: int = -1  # for shape/strides/ndim: the index of the input they describe


@dataclass(frozen=True)
class MetalKernel:
    """One kernel as MLX would compile it: ``text`` is MLX's ``kernel_source`` (header, signature,
    body, instantiation); ``source`` prefixes the model of ``metal::utils()``."""

    name: str
    text: str
    buffers: tuple[Buffer, ...]
    attributes: tuple[tuple[str, str], ...]  # (attribute name, type) in parameter order
    template: tuple[tuple[str, str, str], ...]  # (name, kind: int/bool/typename, value text)
    header: str

    @property
    def source(self) -> str:
        return '#include "msl.h"\n' + self.text

    @property
    def call_name(self) -> str:
        """The function to call: the instantiation ``name<...>`` or the plain function."""
        if not self.template:
            return self.name
        return f"{self.name}<{', '.join(v for _, _, v in self.template)}>"


def type_string(dtype: mx.Dtype) -> str:
    try:
        return TYPE_STRINGS[dtype]
    except KeyError:
        raise MetalSourceError(f"Metal kernels have no type for {dtype}") from None


def _template_value(value: Any) -> tuple[str, str]:
    """(kind, text) as write_template writes it: an ostream of the int, the bool (1/0), the type."""
    if isinstance(value, bool):
        return "bool", "1" if value else "0"
    if isinstance(value, int):
        return "int", str(value)
    if isinstance(value, mx.Dtype):
        return "typename", type_string(value)
    raise MetalSourceError(f"template argument {value!r} is not an int, bool or mlx dtype")


def metal_kernel(
    name: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    source: str,
    header: str,
    input_dtypes: Sequence[mx.Dtype],
    input_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[mx.Dtype],
    template: Sequence[tuple[str, Any]] = (),
) -> MetalKernel:
    """What ``mx.fast.metal_kernel(name=name, ...)(inputs=..., template=...)`` compiles."""
    if not output_names:
        raise MetalSourceError("[metal_kernel] Must specify at least one output.")
    if len(input_dtypes) != len(input_names) or len(input_shapes) != len(input_names):
        raise MetalSourceError(f"expected {len(input_names)} inputs, got {len(input_dtypes)}")
    if len(output_dtypes) != len(output_names):
        raise MetalSourceError(f"expected {len(output_names)} output dtypes, got {len(output_dtypes)}")
    tmpl = tuple((n, *_template_value(v)) for n, v in template)
    kernel_name = "custom_kernel_" + name
    if tmpl:
        template_def = "<" + ", ".join(v for _, _, v in tmpl) + ">"
        kernel_name += "_" + re.sub(r"<|>|(, )", "_", template_def)[:-1]
    sizes = [math.prod(s) for s in input_shapes]
    for dt, shape, size in zip(input_dtypes, input_shapes, sizes, strict=True):
        kernel_name += "_" + type_string(dt)
        kernel_name += "s" if len(shape) == 0 else ("c" if size < MAX_CONSTANT_ARRAY_SIZE else "")
    for dt in output_dtypes:
        kernel_name += "_" + type_string(dt)

    buffers: list[Buffer] = []
    out = [header]
    if tmpl:
        out.append("template <" + ", ".join(f"{kind} {n}" for n, kind, _ in tmpl) + ">\n")
    out.append(f"[[kernel]] void {kernel_name}(\n")
    inputs = zip(input_names, input_dtypes, input_shapes, sizes, strict=True)
    for i, (n, dt, shape, size) in enumerate(inputs):
        space = "constant" if size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if len(shape) == 0 else "*"
        out.append(f"  const {space} {type_string(dt)}{ref} {n} [[buffer({len(buffers)})]],\n")
        buffers.append(Buffer(n, "input", type_string(dt), space, scalar=len(shape) == 0))
        if shape:
            if n + "_shape" in source:
                out.append(f"  const constant int* {n}_shape [[buffer({len(buffers)})]],\n")
                buffers.append(Buffer(n + "_shape", "shape", "int", "constant", of=i))
            if n + "_strides" in source:
                out.append(f"  const constant int64_t* {n}_strides [[buffer({len(buffers)})]],\n")
                buffers.append(Buffer(n + "_strides", "strides", "int64_t", "constant", of=i))
            if n + "_ndim" in source:
                out.append(f"  const constant int& {n}_ndim [[buffer({len(buffers)})]],\n")
                buffers.append(Buffer(n + "_ndim", "ndim", "int", "constant", scalar=True, of=i))
    attributes = tuple((a, t) for a, t in ATTRIBUTES if a in source)
    n_args = len(input_names) + len(output_names)
    for n, dt in zip(output_names, output_dtypes, strict=True):
        index = len(buffers)
        out.append(f"  device {type_string(dt)}* {n} [[buffer({index})]]")
        buffers.append(Buffer(n, "output", type_string(dt), "device"))
        # MLX compares the buffer index (shape buffers included) with the argument count here
        out.append(",\n" if index < n_args - 1 or attributes else ") {\n")
    for i, (a, t) in enumerate(attributes):
        out.append(f"  {t} {a} [[{a}]]" + (",\n" if i < len(attributes) - 1 else ") {\n"))
    out.append(source + "\n}\n")
    if tmpl:
        inst = kernel_name + "<" + ", ".join(v for _, _, v in tmpl) + ">"
        out.append(f'\ntemplate [[host_name("{kernel_name}")]] [[kernel]] decltype({inst}) {inst};\n')
    return MetalKernel(kernel_name, "".join(out), tuple(buffers), attributes, tmpl, header)


def from_record(record: Any) -> MetalKernel:
    """The kernel of a captured catalog launch (:class:`kernelfleet.kernels.render.launch.LaunchRecord`)."""
    r = record.rendered
    return metal_kernel(r.name, r.inputs, r.outputs, r.source, r.header, record.input_dtypes,
                        record.input_shapes, record.output_dtypes, record.launch.template)
