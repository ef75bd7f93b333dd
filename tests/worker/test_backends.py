"""Backend registry and detection, and what each backend offers as candidates."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.chips import detect_chip
from kernelfleet.kernels.catalog import get_spec
from kernelfleet.worker.backends import (
    Backend,
    BackendError,
    BackendUnavailable,
    UnknownBackend,
    available_backends,
    backend_names,
    detect_backend,
    get_backend,
)


def test_registry_names_and_lookup():
    assert backend_names() == ["metal", "cuda", "cpu"]
    for name in backend_names():
        cls_backend = get_backend(name) if name in {b.name for b in available_backends()} else None
        if cls_backend is not None:
            assert isinstance(cls_backend, Backend) and cls_backend.name == name
    with pytest.raises(UnknownBackend, match="choose one of: metal, cuda, cpu"):
        get_backend("vulkan")


def test_detection_agrees_with_chip_detection():
    assert detect_backend().name == detect_chip().backend
    assert available_backends()[-1].name == "cpu"  # always there, always last


@pytest.mark.skipif(mx.metal.is_available() or mx.cuda.is_available(), reason="a GPU host")
def test_gpu_backends_unavailable_here():
    for name in ("metal", "cuda"):
        with pytest.raises(BackendUnavailable, match=f"the {name} backend is not available"):
            get_backend(name)
    assert detect_backend().name == "cpu"


def test_cpu_backend_offers_only_the_builtin():
    cpu = get_backend("cpu")
    spec = get_spec("rmsnorm")
    shape = (8, 256)
    assert not cpu.supports_custom_kernels and cpu.device == mx.Device(mx.cpu)
    assert cpu.candidates(spec, shape, "float16") == [{"variant": "builtin"}]
    fn = cpu.build(spec, {"variant": "builtin"}, shape, "float16")
    x = spec.make_inputs(shape, "float16", 0)
    assert fn(x)[0].shape == x[0].shape
    custom = spec.space(shape, "float16")[0]
    with pytest.raises(BackendError, match="runs only the built-in"):
        cpu.build(spec, custom, shape, "float16")


@pytest.mark.cuda
@pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")
def test_cuda_backend_offers_builtin_and_space():
    be = detect_backend()
    spec = get_spec("rmsnorm")
    cands = be.candidates(spec, (32, 4096), "float16")
    assert be.name == "cuda" and cands[0] == {"variant": "builtin"}
    assert len(cands) == 1 + len(spec.space((32, 4096), "float16"))


@pytest.mark.metal
@pytest.mark.skipif(not mx.metal.is_available(), reason="needs MLX's Metal backend")
def test_metal_backend_offers_builtin_and_space():
    be = detect_backend()
    spec = get_spec("rmsnorm")
    cands = be.candidates(spec, (32, 4096), "float16")
    assert be.name == "metal" and cands[0] == {"variant": "builtin"} and len(cands) > 1
