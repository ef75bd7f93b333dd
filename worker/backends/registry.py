"""Backend registry: look one up by name, or detect the best this machine can run."""

from __future__ import annotations

from kernelfleet.worker.backends.base import Backend, BackendUnavailable, UnknownBackend
from kernelfleet.worker.backends.cpu import CpuBackend
from kernelfleet.worker.backends.cuda import CudaBackend
from kernelfleet.worker.backends.metal import MetalBackend

# Detection order: the first available wins (a GPU before the CPU).
_BACKENDS: dict[str, type[Backend]] = {"metal": MetalBackend, "cuda": CudaBackend, "cpu": CpuBackend}


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called ``name``; raises UnknownBackend / BackendUnavailable with a clear message."""
    cls = _BACKENDS.get(name)
    if cls is None:
        raise UnknownBackend(f"unknown backend {name!r}; choose one of: {', '.join(_BACKENDS)}")
    backend = cls()
    if not backend.available():
        raise BackendUnavailable(f"the {name} backend is not available on this machine "
                                 f"(available: {', '.join(b.name for b in available_backends())})")
    return backend


def available_backends() -> list[Backend]:
    return [b for b in (cls() for cls in _BACKENDS.values()) if b.available()]


def detect_backend() -> Backend:
    """The best backend this machine can run: metal or cuda when MLX has it, else cpu."""
    return available_backends()[0]
