"""The Backend interface: one implementation per module (metal.py, cuda.py, cpu.py)."""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future

import mlx.core as mx

from kernelfleet.kernels.render.launch import LaunchRecord, compiled_call
from kernelfleet.kernels.render.metal import PRELUDE as METAL_PRELUDE
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
    (:func:`~kernelfleet.kernels.render.launch.compiled_call`), as the runtime runs both. A backend without
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
            for config in spec.space_for(shape, dtype, self.kernel_backend):
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

    def kernel_identity(self, spec: KernelSpec, config: Config, shape: Shape, dtype: str,
                        inputs: Sequence[mx.array]) -> str | None:
        """A digest of what ``config``'s launches hand to MLX on this backend: each kernel's rendered
        source and header, template arguments, grid and threadgroup, input and output shapes and
        dtypes. Two configs with one digest run the same kernels the same way (on Metal the ``hint``
        axis renders identical source), so one measurement stands for both. None: the built-in, a
        backend without custom kernels here, or a config that does not render (its build reports it)."""
        if (config_key(config) == "builtin" or not self.supports_custom_kernels
                or self.kernel_backend not in spec.backends):
            return None
        from kernelfleet.kernels.render.launch import capture

        try:
            with capture() as records:
                spec.build(config, self.kernel_backend, shape, dtype)(inputs)
        except Exception:  # noqa: BLE001 - the real build raises it again and records it
            return None
        if not records:
            return None
        text = repr([(r.rendered.source, r.rendered.header, r.rendered.inputs, r.rendered.outputs,
                      _effective_template(r), r.launch.grid, r.launch.threadgroup,
                      [str(d) for d in r.input_dtypes], r.input_shapes, r.output_shapes,
                      [str(d) for d in r.output_dtypes]) for r in records])
        return hashlib.sha256(text.encode()).hexdigest()


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


# a template argument passed as kf_vload_h / kf_vstore_h's cache hint (their second)
_HINT_USE = re.compile(r"\bkf_v(?:load|store)_h<\s*[^,<>]+,\s*(\w+)\s*>")


def inert_template_args(source: str, header: str) -> frozenset[str]:
    """Template arguments a Metal kernel's text (its body ``source`` and ``header``, prelude
    excluded) uses only as the cache hint of kf_vload_h / kf_vstore_h, which the Metal prelude
    ignores (MSL has no cache hints, kernels/render/metal.py): kernels differing only in them are
    the same code."""
    text = source + header.removeprefix(METAL_PRELUDE)
    hinted = set(_HINT_USE.findall(text))
    rest = _HINT_USE.sub("", text)
    return frozenset(h for h in hinted if not re.search(rf"\b{re.escape(h)}\b", rest))


def _effective_template(record: LaunchRecord) -> tuple[tuple[str, str], ...]:
    """The launch's template arguments, less those the Metal text ignores (the cache hint H: MSL has
    none, so the hint axis renders the same code; kernels/render/metal.py)."""
    inert = (inert_template_args(record.rendered.source, record.rendered.header)
             if record.rendered.backend == "metal" else frozenset())
    return tuple((name, str(value)) for name, value in record.launch.template if name not in inert)
