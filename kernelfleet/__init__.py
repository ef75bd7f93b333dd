"""KernelFleet. ``kernelfleet.patch(model)`` / ``kernelfleet.unpatch(model)`` route an mlx-lm model
through the kernels this chip's profile picked (:mod:`kernelfleet.kernels.patch.model_patch`).
``kernelfleet.apply_settings(file, model=..., workload=...)`` sets MLX's runtime settings chosen for
this chip in the environment, before MLX is imported (:mod:`kernelfleet.worker.runtime_settings.apply`;
imports no mlx).

The folders ``service/``, ``worker/``, ``web/``, ``kernels/`` and ``migrations/`` are the subpackages
``kernelfleet.<folder>``. ``patch``, ``unpatch`` and ``apply_settings`` load lazily (module
``__getattr__``), so importing ``kernelfleet.service`` never imports mlx or mlx-lm.
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply_settings", "patch", "unpatch"]


def __getattr__(name: str) -> Any:
    if name == "apply_settings":
        from kernelfleet.worker.runtime_settings.apply import apply

        return apply
    if name in __all__:
        from kernelfleet.kernels.patch import model_patch

        return getattr(model_patch, name)
    raise AttributeError(f"module 'kernelfleet' has no attribute {name!r}")
