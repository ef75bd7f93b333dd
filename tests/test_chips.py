"""Chip detection: pure parsers fed recorded outputs, plus detection on this (Linux CPU) host."""

from __future__ import annotations

import json
import platform

import mlx.core as mx
import pytest

from kernelfleet import chips as chipmod
from kernelfleet.chips import (
    detect_chip,
    format_os,
    parse_apple_arch_variant,
    parse_apple_chip,
    parse_cpuinfo_model,
    parse_cuda_device_info,
    parse_ioreg_gpu_cores,
    parse_nvidia_driver,
    parse_system_profiler_gpu_cores,
)


def system_profiler(model: str, cores: int) -> str:
    """A `system_profiler SPDisplaysDataType -json` output as macOS 14/15 print it."""
    return json.dumps({"SPDisplaysDataType": [{
        "_name": model,
        "spdisplays_mtlgpufamilysupport": "spdisplays_metal3",
        "spdisplays_ndrvs": [{"_name": "Color LCD", "_spdisplays_pixels": "3456 x 2234",
                              "spdisplays_main": "spdisplays_yes", "spdisplays_online": "spdisplays_yes"}],
        "spdisplays_vendor": "sppci_vendor_Apple",
        "sppci_bus": "spdisplays_builtin",
        "sppci_cores": str(cores),
        "sppci_device_type": "spdisplays_gpu",
        "sppci_model": model,
    }]}, indent=2)


IOREG_M2_ULTRA = """+-o AGXAcceleratorG14D  <class AGXAcceleratorG14D, id 0x1000003d5, registered, matched, \
active>
    {
      "IOClass" = "AGXAcceleratorG14D"
      "gpu-core-count" = 76
      "IOMatchCategory" = "IOAcceleratorES"
      "model" = "Apple M2 Ultra"
    }
"""

# (brand_string, Metal device_name, architecture, system_profiler, expected name, family, variant, cores)
MACS = [
    ("Apple M1", "Apple M1", "applegpu_g13g", system_profiler("Apple M1", 8), "Apple M1", "M1", None, 8),
    ("Apple M3 Max", "Apple M3 Max", "applegpu_g15c", system_profiler("Apple M3 Max", 40),
     "Apple M3 Max", "M3", "Max", 40),
    ("Apple M4 Pro", "Apple M4 Pro", "applegpu_g16s", system_profiler("Apple M4 Pro", 20),
     "Apple M4 Pro", "M4", "Pro", 20),
    ("Apple M2 Ultra", "Apple M2 Ultra", "applegpu_g14d", system_profiler("Apple M2 Ultra", 76),
     "Apple M2 Ultra", "M2", "Ultra", 76),
]


@pytest.mark.parametrize(("brand", "device", "arch", "sp", "name", "family", "variant", "cores"), MACS)
def test_apple_chips(brand, device, arch, sp, name, family, variant, cores):
    assert parse_apple_chip(brand, device, arch) == (name, family, variant)
    assert parse_system_profiler_gpu_cores(sp) == cores


def test_m4_max_is_not_reported_as_m4():
    # ZMLX's bug: a source that only says "M4" must not hide the Max the others report.
    assert parse_apple_chip("Apple M4", "Apple M4 Max", "applegpu_g16c") == ("Apple M4 Max", "M4", "Max")
    assert parse_apple_chip("Apple M4", "", "applegpu_g16c") == ("Apple M4 Max", "M4", "Max")
    assert parse_apple_chip("Apple M4", "Apple M4", "applegpu_g16g") == ("Apple M4", "M4", None)


def test_arch_suffixes():
    assert [parse_apple_arch_variant(a) for a in ("applegpu_g13g", "applegpu_g15s", "applegpu_g14c",
                                                  "applegpu_g13d", "sm_90", "", None)] == \
        [None, "Pro", "Max", "Ultra", None, None, None]


def test_unknown_apple_text_is_kept_not_invented():
    assert parse_apple_chip("Apple Silicon Z1", "", "") == ("Apple Silicon Z1", None, None)


def test_gpu_cores_fallbacks_and_garbage():
    assert parse_ioreg_gpu_cores(IOREG_M2_ULTRA) == 76
    assert parse_ioreg_gpu_cores("") is None
    assert parse_system_profiler_gpu_cores("not json") is None
    assert parse_system_profiler_gpu_cores(json.dumps({"SPDisplaysDataType": [{"_name": "x"}]})) is None
    assert parse_system_profiler_gpu_cores(json.dumps({"other": 1})) is None


CPUINFO_X86 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC 9654 96-Core Processor
stepping	: 1
"""
CPUINFO_ARM = """processor	: 0
BogoMIPS	: 2000.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32
CPU implementer	: 0x41

Hardware	: BCM2835
Model		: Raspberry Pi 5 Model B Rev 1.0
"""


def test_cpuinfo():
    assert parse_cpuinfo_model(CPUINFO_X86) == "AMD EPYC 9654 96-Core Processor"
    assert parse_cpuinfo_model(CPUINFO_ARM) == "Raspberry Pi 5 Model B Rev 1.0"
    assert parse_cpuinfo_model("") is None


def test_nvidia():
    info = {"device_name": "NVIDIA H100 80GB HBM3", "architecture": "sm_90", "total_memory": 85045477376,
            "free_memory": 84000000000, "uuid": "GPU-1234", "compute_capability_major": 9,
            "compute_capability_minor": 0}
    assert parse_cuda_device_info(info) == {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90",
                                            "memory_bytes": 85045477376, "gpu_cores": None}
    # fields vary by MLX version: architecture absent, or written as a compute capability
    assert parse_cuda_device_info({"device_name": "NVIDIA H200", "compute_capability_major": 9,
                                   "compute_capability_minor": 0, "memory_size": 150})["arch"] == "sm_90"
    assert parse_cuda_device_info({"architecture": "8.6"})["arch"] == "sm_86"
    assert parse_cuda_device_info({}) == {"name": "NVIDIA GPU (unknown)", "arch": None, "memory_bytes": None,
                                          "gpu_cores": None}
    proc = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert parse_nvidia_driver(proc) == "550.54.15"
    assert parse_nvidia_driver("565.57.01\n") == "565.57.01"
    assert parse_nvidia_driver("") is None


def test_format_os():
    assert format_os("Darwin", "24.1.0", "15.1") == "macOS 15.1"
    assert format_os("Linux", "6.1.0-18-amd64") == "Linux 6.1.0-18-amd64"


def test_detect_chip_on_this_host():
    info = detect_chip()
    assert info.mlx_version == mx.__version__
    assert info.os.startswith(platform.system() if platform.system() != "Darwin" else "macOS")
    assert info.memory_bytes is None or info.memory_bytes > 0
    if info.backend == "cpu":
        with open("/proc/cpuinfo") as f:
            assert info.name == parse_cpuinfo_model(f.read())
        assert info.gpu_cores is None and info.family is None and info.variant is None
    assert chipmod.detect_chip() is info  # cached: detection shells out at most once


@pytest.mark.metal
@pytest.mark.skipif(not mx.metal.is_available(), reason="needs MLX's Metal backend")
def test_detect_chip_on_a_mac():
    info = detect_chip()
    assert info.backend == "metal" and info.name.startswith("Apple M") and info.family
    assert info.gpu_cores and info.gpu_cores >= 7


@pytest.mark.cuda
@pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")
def test_detect_chip_on_nvidia():
    info = detect_chip()
    assert info.backend == "cuda" and "NVIDIA" in info.name and (info.arch or "").startswith("sm_")
