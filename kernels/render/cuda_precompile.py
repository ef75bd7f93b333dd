"""CUDA: compile custom kernels before their first launch, several at once, into MLX's PTX cache.

MLX's CUDA backend compiles an ``mx.fast.cuda_kernel`` with NVRTC at its first launch (about 1.5 s
on an H100/H200 host), one kernel at a time, and keeps the module in that process only: custom
kernels are never written to the on-disk cache (``use_disk_cache`` is false in MLX's
``custom_kernel.cpp``). But ``JitModule`` (``jit_module.cpp``) looks in that cache before it
compiles anything: ``<cache>/<module>.ptx`` (a cubin or PTX) and ``<module>.txt`` (kernel name, a
tab, its lowered name), where ``<cache>`` is ``$MLX_PTX_CACHE_DIR`` or ``<tmp>/mlx/<version>/ptx``
and ``<module>`` is ``<kernel name>_<std::hash of the generated source, hex>``.

So for a launch captured without running (:func:`kernelfleet.kernels.render.launch.capture`) this module:

1. writes the source MLX would generate (:func:`mlx_source`, after ``build_kernel``: MLX's header,
   ours, the signature from the inputs' dtypes and their ``_shape``/``_strides``/``_ndim`` uses, the
   template constants, the body);
2. names it as MLX does (:func:`module_name`; libstdc++'s ``std::hash<std::string>`` is
   ``_Hash_bytes(data, len, 0xc70f6907)``, :func:`std_hash`);
3. compiles it with MLX's NVRTC, options, include paths and embedded headers (:func:`toolchain`),
   all at once in a pool of processes (:mod:`kernelfleet.kernels.render.nvrtc`: one process's NVRTC
   compiles one program at a time);
4. writes both files (the ``.txt`` first, the cubin by an atomic rename, so MLX never reads half).

At the first launch MLX then loads the file instead of compiling. Where anything differs (another
MLX version's source layout, a header NVRTC cannot find here), the names do not meet and MLX
compiles as it always did: a miss costs the compile, never a wrong kernel, because a file is only
ever found under the hash of the exact source it was compiled from. The files are cubins for this
GPU, like MLX's own entries in that directory (whose default path has MLX's version in it): a
``MLX_PTX_CACHE_DIR`` shared by two GPU kinds fails MLX's own kernels as it fails these.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from . import nvrtc
from .launch import LaunchRecord, capture

# ----------------------------------------------------------------------------- MLX's names

_DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

"""
_CUDA_TYPES = {
    "bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
    "complex64": "mlx::core::cu::complex64_t",
}
_TYPE_STRINGS = {  # get_type_string: the template-argument part of a kernel's name
    "float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t", "float64": "double",
    "complex64": "complex64_t", "bool": "bool", "int8": "int8_t", "int16": "int16_t",
    "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t",
    "uint32": "uint32_t", "uint64": "uint64_t",
}
_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907
MAX_FILE_NAME = 245  # get_ptx_path: longer module names are split into directories


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def std_hash(data: bytes) -> int:
    """libstdc++'s ``std::hash<std::string>`` on a 64-bit build: ``_Hash_bytes(data, len, 0xc70f6907)``."""
    n = len(data)
    h = (_SEED ^ (n * _MUL)) & _MASK
    aligned = n & ~7
    for (word,) in struct.iter_unpack("<Q", data[:aligned]):
        h ^= (_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK
        h = (h * _MUL) & _MASK
    if n & 7:
        h ^= int.from_bytes(data[aligned:], "little")
        h = (h * _MUL) & _MASK
    h = (_shift_mix(h) * _MUL) & _MASK
    return _shift_mix(h)


def _name_suffix(value: Any) -> str:
    """One template argument's part of the kernel's name (``template_arguments_hash``)."""
    if isinstance(value, bool):
        return "_t" if value else "_f"
    if isinstance(value, int):
        return f"_{value}"
    return "_" + _TYPE_STRINGS[_dtype_name(value)]


def _declaration(name: str, value: Any) -> str:
    """One template argument's line at the top of the kernel body."""
    if isinstance(value, bool):
        return f"  constexpr bool {name} = {'true' if value else 'false'};\n"
    if isinstance(value, int):
        return f"  constexpr int {name} = {value};\n"
    return f"  using {name} = {_CUDA_TYPES[_dtype_name(value)]};\n"


def kernel_name(record: LaunchRecord) -> str:
    """``custom_kernel_<name><template arguments>``: the name MLX gives the launch's kernel."""
    return "custom_kernel_" + record.rendered.name + "".join(
        _name_suffix(v) for _, v in record.launch.template)


def mlx_source(record: LaunchRecord) -> str:
    """The full CUDA source MLX generates for ``record`` (``build_kernel`` in custom_kernel.cpp)."""
    r = record.rendered
    parts = [_DEFAULT_HEADER, r.header, "namespace mlx::core::cu {\n\n",
             "namespace cg = cooperative_groups;\n\n", "__global__ void ", kernel_name(record), "(\n"]
    for name, dtype, shape in zip(r.inputs, record.input_dtypes, record.input_shapes, strict=True):
        parts.append(f"    const {_CUDA_TYPES[_dtype_name(dtype)]}* {name},\n")
        if len(shape) > 0:
            if name + "_shape" in r.source:
                parts.append(f"    const __grid_constant__ Shape {name}_shape,\n")
            if name + "_strides" in r.source:
                parts.append(f"    const __grid_constant__ Strides {name}_strides,\n")
            if name + "_ndim" in r.source:
                parts.append(f"    const __grid_constant__ int {name}_ndim,\n")
    for i, (name, dtype) in enumerate(zip(r.outputs, record.output_dtypes, strict=True)):
        end = ",\n" if i < len(r.outputs) - 1 else ") {\n"
        parts.append(f"    {_CUDA_TYPES[_dtype_name(dtype)]}* {name}{end}")
    if record.launch.template:
        parts += [_declaration(name, value) for name, value in record.launch.template]
        parts.append("\n")
    parts += [r.source, "\n}\n\n} // namespace mlx::core::cu\n"]
    return "".join(parts)


def _module(kernel: str, source: str) -> str:
    """MLX's module name: ``<kernel name>_<std::hash of the source, hex>``."""
    return f"{kernel}_{std_hash(source.encode()):x}"


def module_name(record: LaunchRecord) -> str:
    return _module(kernel_name(record), mlx_source(record))


def cache_dir() -> Path:
    """The directory MLX reads cached modules from (``ptx_cache_dir`` in jit_module.cpp)."""
    configured = os.environ.get("MLX_PTX_CACHE_DIR")
    if configured:
        return Path(configured).absolute()
    return Path(tempfile.gettempdir()) / "mlx" / str(getattr(mx, "__version__", "")) / "ptx"


def ptx_path(directory: Path, module: str) -> Path:
    """Where MLX looks for ``module`` (``get_ptx_path``: names over 245 characters become directories)."""
    if len(module) <= MAX_FILE_NAME:
        return directory / (module + ".ptx")
    path, offset = directory, 0
    while len(module) - offset > MAX_FILE_NAME:
        path /= module[offset:offset + MAX_FILE_NAME]
        offset += MAX_FILE_NAME
    return path / (module[offset:] + ".ptx")


# ----------------------------------------------------------------------------- NVRTC

class NvrtcUnavailable(RuntimeError):
    """NVRTC, MLX's headers or the CUDA headers cannot be found in this process."""


def _maps() -> list[tuple[int, int, str, str]]:
    """This process's file mappings: (start, end, permissions, path); none where /proc is absent."""
    out = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6:
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    out.append((lo, hi, fields[1], fields[5].strip()))
    except OSError:
        return []
    return out


def _loaded_library(pattern: str) -> str | None:
    """The path of a shared library this process has mapped whose file name matches ``pattern``."""
    return next((path for *_, path in _maps() if re.search(pattern, os.path.basename(path))), None)


def _mapped(path: str) -> list[tuple[int, int]]:
    """The readable address ranges this process has mapped from the file ``path``."""
    return [(lo, hi) for lo, hi, perms, where in _maps() if where == path and perms.startswith("r")]


HEADER_PREFIX = b"mlx/backend/cuda/device/"
PADDING_WORDS = 8  # null words allowed between the two tables (alignment)


def embedded_headers(mlx_path: str) -> tuple[list[bytes], list[bytes]]:
    """The device headers MLX hands NVRTC (``g_headers`` and ``g_include_names`` in jit_module.cpp):
    embedded in libmlx at build time, not shipped as files. Read from this process's memory: the
    include names are found as strings, then the array of pointers to them, then the array of as
    many pointers to header texts beside it. Raises :class:`NvrtcUnavailable` where the layout is
    not that."""
    regions = [(lo, ctypes.string_at(lo, hi - lo)) for lo, hi in _mapped(mlx_path)]

    def inside(address: int) -> bool:
        return any(lo <= address < lo + len(data) for lo, data in regions)

    def text(address: int) -> bytes | None:
        for lo, data in regions:
            if lo <= address < lo + len(data):
                end = data.find(b"\0", address - lo)
                return data[address - lo:end] if end >= 0 else None
        return None

    def pointer(address: int) -> int | None:
        for lo, data in regions:
            if lo <= address <= lo + len(data) - 8:
                return int(struct.unpack_from("<Q", data, address - lo)[0])
        return None

    def is_name(address: int | None) -> bool:
        found = text(address) if address is not None and inside(address) else None
        return found is not None and found.startswith(HEADER_PREFIX)

    for lo, data in regions:  # the string "mlx/backend/cuda/device/utils.cuh", NUL before and after
        at = data.find(b"\0" + HEADER_PREFIX + b"utils.cuh\0")
        if at >= 0:
            name_address = lo + at + 1
            break
    else:
        raise NvrtcUnavailable(f"no embedded CUDA device headers found in {mlx_path}")
    for lo, data in regions:
        hit = data.find(struct.pack("<Q", name_address))
        while hit >= 0 and (lo + hit) % 8:
            hit = data.find(struct.pack("<Q", name_address), hit + 1)
        if hit >= 0:
            start = end = lo + hit
            while is_name(pointer(start - 8)):
                start -= 8
            while is_name(pointer(end + 8)):
                end += 8
            end += 8
            break
    else:
        raise NvrtcUnavailable("MLX's table of embedded header names was not found")
    n = (end - start) // 8
    names = [text(pointer(start + 8 * i) or 0) or b"" for i in range(n)]

    def header_text(address: int | None) -> bytes | None:
        found = text(address) if address else None
        if found is None or len(found) < 16 or b"\n" not in found or min(found) < 9:
            return None
        try:
            found.decode("utf-8")
        except UnicodeDecodeError:
            return None  # machine code, not a header
        return found

    # the texts' table sits beside the names' (after or before it, past a few null words of padding)
    after, before = end, start - 8
    for _ in range(PADDING_WORDS):
        after += 8 if pointer(after) == 0 else 0
        before -= 8 if pointer(before) == 0 else 0
    for base in (after, before - 8 * (n - 1)):
        texts = [header_text(pointer(base + 8 * i)) for i in range(n)]
        if all(texts):
            return [t for t in texts if t], names
    raise NvrtcUnavailable("MLX's table of embedded header texts was not found")


def _include_args(mlx_lib: Path, cuda_major: int) -> list[str]:
    """``include_path_args`` of jit_module.cpp: MLX's bundled headers, CCCL, the CUDA runtime's."""
    root = mlx_lib.parent.parent  # .../mlx/lib/libmlx.so -> .../mlx
    include = root / "include"
    args = [f"--include-path={include}"] if include.exists() else []
    if (include / "cccl").exists():
        args.append(f"--include-path={include / 'cccl'}")
    cudart = root.parent / "nvidia" / ("cuda_runtime" if cuda_major < 13 else "cu13") / "include"
    if not cudart.exists():
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        cudart = Path(home) / "include"
    if not cudart.exists():
        raise NvrtcUnavailable("the CUDA runtime headers were not found (set CUDA_HOME)")
    args.append(f"--include-path={cudart}")
    return args


def _toolchain(arch: str) -> nvrtc.Toolchain:
    mx.eval(mx.zeros((1,)))  # MLX maps its libraries (NVRTC among them) once it has run
    nvrtc_path = _loaded_library(r"^libnvrtc\.so")
    mlx_path = _loaded_library(r"^libmlx\.so")
    if nvrtc_path is None or mlx_path is None:
        raise NvrtcUnavailable("this process has not loaded MLX's CUDA libraries (libnvrtc, libmlx)")
    major, minor = nvrtc.version(nvrtc_path)
    if (major, minor) < (11, 8):
        raise NvrtcUnavailable(f"NVRTC {major}.{minor} does not build cubins for this GPU")
    m = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", arch)
    if not m:
        raise NvrtcUnavailable(f"unknown CUDA architecture {arch!r}")
    headers, names = embedded_headers(mlx_path)
    target = f"sm_{m.group(1)}{m.group(2)}" + ("a" if int(m.group(1)) >= 9 else "")
    return nvrtc.Toolchain(
        library=nvrtc_path,
        options=("--device-as-default-execution-space", f"--gpu-architecture={target}",
                 *_include_args(Path(mlx_path), major)),
        headers=tuple(headers), include_names=tuple(names))


_toolchains: dict[str, nvrtc.Toolchain | NvrtcUnavailable] = {}
_pools: dict[str, nvrtc.CompilePool] = {}
_lock = threading.Lock()


def toolchain(arch: str) -> nvrtc.Toolchain:
    """This process's NVRTC set-up for ``arch``, as MLX compiles custom kernels: MLX's NVRTC, its
    options (``sm_XY``, plus ``a`` from compute capability 9 on: a cubin for this GPU), its include
    paths and its embedded headers. Raises :class:`NvrtcUnavailable` (every time) when it cannot be
    had. Call it on the thread that runs MLX: it touches MLX once."""
    with _lock:
        if arch not in _toolchains:
            try:
                _toolchains[arch] = _toolchain(arch)
            except NvrtcUnavailable as e:
                _toolchains[arch] = e
        found = _toolchains[arch]
    if isinstance(found, NvrtcUnavailable):
        raise found
    return found


def _pool(arch: str) -> nvrtc.CompilePool:
    chain = toolchain(arch)
    with _lock:
        if arch not in _pools:
            _pools[arch] = nvrtc.CompilePool(chain)
        return _pools[arch]


# ----------------------------------------------------------------------------- precompile

@dataclass(frozen=True)
class Outcome:
    """What one :func:`precompile` call did."""

    compiled: int  # modules compiled and written now
    cached: int  # modules already in the cache
    failed: dict[str, str]  # module -> why (MLX compiles it at its first launch, and says why)
    seconds: float


def _write(path: Path, kernel: str, cubin: bytes, lowered: str) -> None:
    """``kernel`` (its full name, namespace included) and its lowered name in the ``.txt``, then the
    cubin by an atomic rename: MLX never finds a ``.ptx`` without its ``.txt`` or half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".txt").write_text(f"{kernel}\t{lowered}\n", encoding="utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kf-", suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(cubin)
    os.replace(tmp, path)


def precompile(records: Iterable[LaunchRecord], arch: str, *, directory: Path | None = None) -> Outcome:
    """Compile every distinct CUDA kernel of ``records`` missing from MLX's cache, all at once in the
    compile pool's processes, and write them where MLX looks. Raises :class:`NvrtcUnavailable` when
    NVRTC or the headers cannot be found; a kernel NVRTC refuses is reported in ``failed`` (MLX then
    compiles it itself and raises its own error at the launch)."""
    start = time.perf_counter()
    where = directory or cache_dir()
    todo: dict[str, nvrtc.Job] = {}
    cached = 0
    for record in records:
        if record.rendered.backend != "cuda":
            continue
        source, kernel = mlx_source(record), kernel_name(record)
        module = _module(kernel, source)
        if module in todo:
            continue
        if ptx_path(where, module).exists():
            cached += 1
            continue
        todo[module] = nvrtc.Job(module, source, f"mlx::core::cu::{kernel}")
    failed: dict[str, str] = {}
    if todo:
        for module, cubin, lowered in _pool(arch).compile(todo.values()):
            if cubin is None:
                failed[module] = lowered[:2000]
                continue
            try:
                _write(ptx_path(where, module), todo[module].kernel, cubin, lowered)
            except OSError as e:
                failed[module] = str(e)
    return Outcome(len(todo) - len(failed), cached, failed, time.perf_counter() - start)


def records_of(calls: Sequence[tuple[Any, Sequence[mx.array]]]) -> list[LaunchRecord]:
    """The launches each ``(fn, inputs)`` would make, captured without running anything."""
    out: list[LaunchRecord] = []
    for fn, inputs in calls:
        with capture() as records:
            fn(inputs)
        out.extend(records)
    return out
