"""Backends: where candidates run (metal, cuda, cpu), chosen by detection from a registry."""

from kernelfleet.worker.backends.base import Backend, BackendError, BackendUnavailable, UnknownBackend
from kernelfleet.worker.backends.registry import (
           available_backends,
           backend_names,
           detect_backend,
           get_backend,
)

__all__ = ["Backend", "BackendError", "BackendUnavailable", "UnknownBackend", "available_backends",
           "backend_names", "detect_backend", "get_backend"]
