"""The Backend interface: one implementation per module (metal.py, cuda.py, cpu.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future

import mlx.core as mx

from kernelfleet.kernels.launch import compiled_call
from kernelfleet.kernels.spec import BUILTIN, Config, KernelFn, KernelSpec, Shape, config_key


class BackendError(Exception):
    """Base class for backend errors."""


class UnknownBackend(BackendError):
    pass


class BackendUnavailable(BackendError):
    pass


class Backend(ABC):
    """Where candidates run.

    ``candidates`` lists the configs to try, the built-in first; ``build`` turns one into a
    callable: the built-in as users call it, a custom kernel as one ``mx.compile``d graph
    (:func:`~kernelfleet.kernels.launch.compiled_call`), as the runtime runs both. A backend without
    custom kernels (cpu) offers the built-in only, and so does a backend a spec's custom kernels
    do not run on (``spec.backends``: zmlx's kernels are Metal-only).
    """

    name: str
    supports_custom_kernels: bool

    @abstractmethod
    def available(self) -> bool:
        """Whether MLX can run this backend on this machine."""

    @property
    def device(self) -> mx.Device:
        return mx.Device(mx.gpu)

    @property
    def kernel_backend(self) -> str:
        """Whose kernels this backend runs: its name, up to a ``-variant`` (``metal-emu`` runs Metal's)."""
        return self.name.split("-", 1)[0]

    def synchronize(self) -> None:
        mx.synchronize()

    def candidates(self, spec: KernelSpec, shape: Shape, dtype: str) -> list[Config]:
        """The built-in plus every valid custom config (deduplicated, in the spec's order)."""
        out: list[Config] = [dict(BUILTIN)]
        if self.supports_custom_kernels and self.kernel_backend in spec.backends:
            seen = {"builtin"}
            for config in spec.space(shape, dtype):
                key = config_key(config)
                if key not in seen:
                    seen.add(key)
                    out.append(dict(config))
        return out

    def unsupported_reason(self, error: BaseException) -> str | None:
        """If ``error`` (raised by a candidate's first launch) means this chip cannot run that config
        at all -- a limit of the chip, not a fault of the kernel -- the reason to record, naming the
        limit; else None (the failure is a compile or launch error)."""
        return None

    def precompile(self, spec: KernelSpec, configs: Sequence[Config], shape: Shape, dtype: str,
                   seed: int) -> Future[str] | None:
        """Start building ``configs``' kernels ahead of their first launch, where this backend can
        do that faster than launch by launch (CUDA: NVRTC in a pool of processes); the future's
        result says what was done. None: nothing to do (kernels compile at their first launch).
        Never raises for a config: a kernel that cannot be built fails at its launch, as before."""
        return None

    def build(self, spec: KernelSpec, config: Config, shape: Shape, dtype: str) -> KernelFn:
        """A callable for ``config``; may raise (the tuner records that as a compile error)."""
        if config_key(config) == "builtin":
            return spec.builtin
        if not self.supports_custom_kernels:
            raise BackendError(f"the {self.name} backend runs only the built-in, not {config_key(config)}")
        if self.kernel_backend not in spec.backends:
            raise BackendError(f"{spec.name}'s custom kernels run on {', '.join(spec.backends)} only, "
                               f"not {self.name}")
        return compiled_call(spec.build(config, self.name, shape, dtype))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
