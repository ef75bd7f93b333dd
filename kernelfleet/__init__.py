"""KernelFleet. ``kernelfleet.patch(model)`` / ``kernelfleet.unpatch(model)`` route an mlx-lm model
through the kernels this chip's profile picked (:mod:`kernelfleet.kernels.model_patch`).

The folders ``service/``, ``worker/``, ``web/``, ``kernels/`` and ``migrations/`` are the subpackages
``kernelfleet.<folder>``. ``patch`` and ``unpatch`` load lazily (module ``__getattr__``), so importing
``kernelfleet.service`` never imports mlx or mlx-lm.
"""

from __future__ import annotations

from typing import Any

__all__ = ["patch", "unpatch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from kernelfleet.kernels import model_patch

        return getattr(model_patch, name)
    raise AttributeError(f"module 'kernelfleet' has no attribute {name!r}")
