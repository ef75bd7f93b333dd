"""Metal without a Mac: a strict compile model of MSL and a CPU emulator of Metal's execution model,
both fed the exact text MLX hands the Metal compiler. For tests (ours and zmlx's kernels):

- :func:`metal_kernel` / :func:`from_record`: MLX's source for one launch (signature, template).
- :func:`compile_strict`: compile kernels with clang against ``msl.h``; a report of errors.
- :class:`Emulator` / :func:`emulate`: run one launch on the CPU emulator of Metal's execution
  model (numpy in, numpy out; raises :class:`EmulationError`).
- the ``metal-emu`` Backend built on the emulator is :mod:`kernelfleet.worker.backends.metal_emu`.

Needs clang++ (Debian ``clang``); nothing here runs on a user's machine.
"""

from .metal_emu import EmulationError, Emulator, emulate
from .mlx_metal import MetalKernel, from_record, metal_kernel
from .msl_strict import StrictReport, compile_strict

__all__ = ["EmulationError", "Emulator", "MetalKernel", "StrictReport", "compile_strict", "emulate",
           "from_record", "metal_kernel"]
