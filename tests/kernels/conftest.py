"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest

from kernelfleet.kernels.testing.metal_emu import Emulator
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend


@pytest.fixture(scope="module")
def emu() -> MetalEmuBackend:
    """The Metal emulator as a kernel backend (launches go to it through ``intercept(emu.launch)``)."""
    backend = MetalEmuBackend(Emulator(seed=0))
    if not backend.available():
        pytest.skip("the Metal emulator needs clang++")
    return backend
