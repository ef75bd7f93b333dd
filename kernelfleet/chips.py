"""Chip identity: what machine this is, and the table of chips KernelFleet knows by name.

Imports nothing of KernelFleet, so the kernels (which chip's profile entry to run), the worker (what
it reports when it enrolls) and the coordinator (which chips a prediction may cross) share it.

**This machine** (:func:`detect_chip`): chip name, backend, GPU cores, memory, OS, MLX version,
driver. Every parser here is a pure function of recorded command output, so tests feed them fixtures
(recorded on M1, M3 Max, M4 Pro, M2 Ultra, H100, Linux hosts); :func:`detect_chip` only gathers
the raw text and hands it to them.

Apple chips: the name comes from ``sysctl -n machdep.cpu.brand_string`` ("Apple M4 Max"), cross
checked with MLX's Metal ``device_name`` and the GPU ``architecture`` suffix (applegpu_g16s = Pro,
g16c = Max, g16d = Ultra), so a Max is never reported as a plain M4. GPU cores come from
``system_profiler SPDisplaysDataType -json`` (``sppci_cores``) or, failing that, ``ioreg``
(``gpu-core-count``).

**The chip table** (:data:`TABLE`, :func:`lookup`, :func:`backend_of`): per chip its backend and
three published figures (Apple's and NVIDIA's specifications): generation (Apple M1..M4; NVIDIA
compute capability), GPU cores (Apple GPU cores; NVIDIA SMs) and memory bandwidth (GB/s). A chip
not in the table is matched by its name (family and variant for Apple chips). How similar two chips
are, from these figures, is the coordinator's (:mod:`kernelfleet.service.chips`).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import mlx.core as mx

MLX_VERSION: str = getattr(mx, "__version__", "unknown")

APPLE_VARIANTS = ("Pro", "Max", "Ultra")
# Suffix letter of Apple's GPU architecture name (applegpu_g15c) -> chip variant.
_ARCH_VARIANT = {"g": None, "p": None, "s": "Pro", "c": "Max", "d": "Ultra"}
_APPLE_RE = re.compile(r"\bM(\d+)(?:\s+(Pro|Max|Ultra))?\b", re.IGNORECASE)


@dataclass(frozen=True)
class ChipInfo:
    name: str                 # "Apple M3 Max", "NVIDIA H100 80GB HBM3", "Intel(R) Xeon(R) ..."
    backend: str              # "metal" | "cuda" | "cpu"
    gpu_cores: int | None
    memory_bytes: int | None
    os: str                   # "macOS 15.1", "Linux 6.1.0-18-amd64"
    mlx_version: str
    driver: str | None        # NVIDIA driver version; None elsewhere
    arch: str | None          # "sm_90", "applegpu_g15s", "x86_64"
    family: str | None = None   # "M3" for Apple silicon, else None
    variant: str | None = None  # "Pro" | "Max" | "Ultra" | None (base chip or non-Apple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- pure parsers


def parse_apple_chip(brand: str | None, device_name: str | None = None,
                     architecture: str | None = None) -> tuple[str, str | None, str | None]:
    """(name, family, variant) from the CPU brand string, Metal device name and GPU architecture.

    The most specific source wins: a variant named anywhere (brand, device name, or the
    architecture suffix) is kept, so "Apple M4" + applegpu_g16c becomes "Apple M4 Max".
    """
    family: str | None = None
    variant: str | None = None
    for text in (brand, device_name):
        m = _APPLE_RE.search(text or "")
        if m:
            family = family or f"M{m.group(1)}"
            if m.group(2) and not variant:
                variant = m.group(2).capitalize()
    arch_variant = parse_apple_arch_variant(architecture)
    if variant is None and arch_variant is not None:
        variant = arch_variant
    if family is None:
        fallback = (brand or device_name or "").strip()
        return (fallback or "Apple silicon (unknown)"), None, variant
    name = f"Apple {family}" + (f" {variant}" if variant else "")
    return name, family, variant


def parse_apple_arch_variant(architecture: str | None) -> str | None:
    """applegpu_g15s -> "Pro", applegpu_g14c -> "Max", applegpu_g13d -> "Ultra", base -> None."""
    m = re.fullmatch(r"applegpu_g\d+([a-z])", (architecture or "").strip())
    return _ARCH_VARIANT.get(m.group(1)) if m else None


def parse_system_profiler_gpu_cores(text: str) -> int | None:
    """GPU core count from ``system_profiler SPDisplaysDataType -json`` output."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return None
    entries = data.get("SPDisplaysDataType") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        cores = entry.get("sppci_cores")
        try:
            n = int(str(cores).strip())
        except (TypeError, ValueError):
            continue
        if n > 0:
            return n
    return None


def parse_ioreg_gpu_cores(text: str) -> int | None:
    """GPU core count from ``ioreg -rc AGXAccelerator -d1`` (``"gpu-core-count" = 40``)."""
    m = re.search(r'"gpu-core-count"\s*=\s*(\d+)', text or "")
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def parse_cpuinfo_model(text: str) -> str | None:
    """The CPU model name from /proc/cpuinfo (x86 "model name", ARM "Model"/"Hardware")."""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        m = re.search(rf"^{re.escape(key)}\s*:\s*(.+?)\s*$", text or "", re.MULTILINE)
        if m and m.group(1):
            return re.sub(r"\s+", " ", m.group(1))
    return None


def parse_nvidia_driver(text: str) -> str | None:
    """Driver version from /proc/driver/nvidia/version or ``nvidia-smi`` query output."""
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", text or "")
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)+)\s*", (text or "").splitlines()[0] if text else "")
    return m.group(1) if m else None


def parse_cuda_device_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """name/arch/memory/cores from MLX's CUDA ``mx.device_info()``; keys vary, so all optional."""
    name = str(info.get("device_name") or info.get("name") or "NVIDIA GPU (unknown)").strip()
    arch = info.get("architecture")
    major, minor = info.get("compute_capability_major"), info.get("compute_capability_minor")
    if isinstance(arch, str) and arch.strip():
        arch = arch.strip()
        if re.fullmatch(r"\d+\.\d+", arch):
            arch = "sm_" + arch.replace(".", "")
    elif major is not None and minor is not None:
        arch = f"sm_{int(major)}{int(minor)}"
    else:
        arch = None
    memory = _first_int(info, ("total_memory", "memory_size", "memory"))
    cores = _first_int(info, ("multi_processor_count", "multiprocessor_count", "sm_count"))
    return {"name": name, "arch": arch, "memory_bytes": memory, "gpu_cores": cores}


def format_os(system: str, release: str, mac_version: str = "") -> str:
    """"macOS 15.1" on a Mac, "Linux 6.1.0-18-amd64" on Linux, else "<system> <release>"."""
    if system == "Darwin":
        return f"macOS {mac_version}" if mac_version else f"macOS (Darwin {release})"
    return f"{system} {release}".strip()


def _first_int(info: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = info.get(key)
        try:
            if value is not None and int(value) > 0:
                return int(value)
        except (TypeError, ValueError):
            continue
    return None


# ----------------------------------------------------------------------------- gathering


def _run(cmd: list[str], timeout: float = 10.0) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _device_info() -> dict[str, Any]:
    try:
        return dict(mx.device_info())
    except Exception:  # noqa: BLE001 - older MLX or no device: detection degrades, never fails
        return {}


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def gpu_backend_available() -> str | None:
    """"metal" or "cuda" when MLX has that GPU backend on this machine, else None."""
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return None


@lru_cache(maxsize=1)
def detect_chip() -> ChipInfo:
    """Describe this machine (cached for the process: it shells out to sysctl/system_profiler)."""
    system, release = platform.system(), platform.release()
    os_name = format_os(system, release, platform.mac_ver()[0])
    backend = gpu_backend_available() or "cpu"
    info = _device_info() if backend != "cpu" or system == "Darwin" else {}

    if system == "Darwin" and platform.machine() == "arm64":
        brand = _run(["sysctl", "-n", "machdep.cpu.brand_string"]).strip()
        name, family, variant = parse_apple_chip(brand, str(info.get("device_name") or ""),
                                                 str(info.get("architecture") or ""))
        cores = (parse_system_profiler_gpu_cores(_run(["system_profiler", "SPDisplaysDataType", "-json"]))
                 or parse_ioreg_gpu_cores(_run(["ioreg", "-rc", "AGXAccelerator", "-d1"])))
        memory = _first_int(info, ("memory_size",)) or _physical_memory()
        arch = str(info.get("architecture") or "") or platform.machine()
        return ChipInfo(name=name, backend=backend, gpu_cores=cores, memory_bytes=memory, os=os_name,
                        mlx_version=MLX_VERSION, driver=None, arch=arch, family=family, variant=variant)

    if backend == "cuda":
        cuda = parse_cuda_device_info(info)
        driver = (parse_nvidia_driver(_read("/proc/driver/nvidia/version"))
                  or parse_nvidia_driver(_run(["nvidia-smi", "--query-gpu=driver_version",
                                               "--format=csv,noheader"])))
        return ChipInfo(name=cuda["name"], backend="cuda", gpu_cores=cuda["gpu_cores"],
                        memory_bytes=cuda["memory_bytes"], os=os_name, mlx_version=MLX_VERSION,
                        driver=driver, arch=cuda["arch"])

    model = parse_cpuinfo_model(_read("/proc/cpuinfo")) or platform.processor() or platform.machine()
    return ChipInfo(name=model or "unknown CPU", backend="cpu", gpu_cores=None,
                    memory_bytes=_physical_memory(), os=os_name, mlx_version=MLX_VERSION,
                    driver=None, arch=platform.machine() or None)


# ----------------------------------------------------------------------------- the chip table


@dataclass(frozen=True)
class Chip:
    name: str
    backend: str  # metal | cuda
    generation: float
    cores: int
    bandwidth_gbs: float


def _apple(family: int, variant: str, cores: int, bw: float) -> Chip:
    name = f"Apple M{family}" + (f" {variant}" if variant else "")
    return Chip(name, "metal", float(family), cores, bw)


# Apple silicon: the largest GPU configuration of each chip (binned parts have fewer cores)
TABLE: tuple[Chip, ...] = (
    _apple(1, "", 8, 68), _apple(1, "Pro", 16, 200), _apple(1, "Max", 32, 400), _apple(1, "Ultra", 64, 800),
    _apple(2, "", 10, 100), _apple(2, "Pro", 19, 200), _apple(2, "Max", 38, 400), _apple(2, "Ultra", 76, 800),
    _apple(3, "", 10, 100), _apple(3, "Pro", 18, 150), _apple(3, "Max", 40, 400), _apple(3, "Ultra", 80, 819),
    _apple(4, "", 10, 120), _apple(4, "Pro", 20, 273), _apple(4, "Max", 40, 546),
    Chip("NVIDIA A100 40GB", "cuda", 8.0, 108, 1555),
    Chip("NVIDIA A100 80GB", "cuda", 8.0, 108, 2039),
    Chip("NVIDIA L4", "cuda", 8.9, 58, 300),
    Chip("NVIDIA L40S", "cuda", 8.9, 142, 864),
    Chip("NVIDIA GeForce RTX 4090", "cuda", 8.9, 128, 1008),
    Chip("NVIDIA H100 PCIe", "cuda", 9.0, 114, 2000),
    Chip("NVIDIA H100 80GB HBM3", "cuda", 9.0, 132, 3350),  # SXM
    Chip("NVIDIA H200", "cuda", 9.0, 132, 4800),
    Chip("NVIDIA GH200", "cuda", 9.0, 132, 4000),
    Chip("NVIDIA B200", "cuda", 10.0, 148, 8000),
)
_BY_NAME = {c.name.casefold(): c for c in TABLE}


def lookup(name: str) -> Chip | None:
    """The table row for a chip name as workers report it ("Apple M3 Max", "NVIDIA H100 80GB HBM3")."""
    key = name.strip().casefold()
    if key in _BY_NAME:
        return _BY_NAME[key]
    m = _APPLE_RE.search(name)
    if name.lower().startswith("apple") and m:
        variant = (m.group(2) or "").capitalize()
        return _BY_NAME.get((f"Apple M{m.group(1)}" + (f" {variant}" if variant else "")).casefold())
    for row in TABLE:  # "NVIDIA H200 NVL" -> "NVIDIA H200": the longest table name it starts with
        if row.backend == "cuda" and key.startswith(row.name.casefold()):
            return row
    return None


def backend_of(name: str) -> str | None:
    """The backend a chip's profile is for, from the table or its vendor prefix; None when unknown."""
    row = lookup(name)
    if row is not None:
        return row.backend
    low = name.strip().lower()
    if low.startswith("apple"):
        return "metal"
    if low.startswith("nvidia"):
        return "cuda"
    return None
