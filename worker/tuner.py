"""Tune one catalog kernel for one shape and dtype on this machine; produce a tuning report.

:func:`tune` is the entry point the CLI and the worker agent call; it returns exactly the tuning
report of the shared contract. :func:`tune_spec` does the work for any :class:`KernelSpec`
(tests and benchmarks use it, and it also returns timings that are not part of the report).
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import mlx.core as mx

from kernelfleet.chips import ChipInfo, detect_chip, parse_cpuinfo_model
from kernelfleet.kernels.spec import (
    BUILTIN,
    Config,
    KernelSpec,
    Shape,
    UnknownKernel,
    UnsupportedDtype,
    config_key,
    format_shape,
    parse_shape,
)
from kernelfleet.worker.backends import Backend, detect_backend, get_backend
from kernelfleet.worker.golden import golden
from kernelfleet.worker.measure import AllCandidatesFailed, Measurer, Trial
from kernelfleet.worker.revision import installed_revision
from kernelfleet.worker.search import Budget, get_strategy
from kernelfleet.worker.search.model import prior_order

MAX_TRIALS = 512
Progress = Callable[[int, int], None]
_CATALOG_MODULES = ("kernelfleet.kernels.catalog", "kernelfleet.kernels.registry")


# ----------------------------------------------------------------------------- catalog access


def _catalog() -> Any:
    for name in _CATALOG_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        if hasattr(module, "get_spec") and hasattr(module, "all_specs"):
            return module
    raise UnknownKernel("the kernel catalog is not installed (no kernelfleet.kernels.catalog)")


def all_specs() -> list[KernelSpec]:
    return list(_catalog().all_specs())


def get_spec(name: str) -> KernelSpec:
    """The catalog spec called ``name``; raises UnknownKernel naming the known kernels."""
    try:
        spec: KernelSpec | None = _catalog().get_spec(name)
    except KeyError:
        spec = None
    if spec is None:
        names = ", ".join(s.name for s in all_specs())
        raise UnknownKernel(f"unknown kernel {name!r}; known kernels: {names}")
    return spec


def resolve(spec: KernelSpec, shape: str | Shape, dtype: str) -> Shape:
    """Validate ``shape`` and ``dtype`` for ``spec`` (BadShape / UnsupportedDtype); the parsed shape."""
    dims = parse_shape(shape) if isinstance(shape, str) else tuple(int(d) for d in shape)
    spec.validate_shape(dims)
    if dtype not in spec.dtypes:
        raise UnsupportedDtype(f"kernel {spec.name!r} does not support dtype {dtype!r}; "
                               f"supported: {', '.join(spec.dtypes)}")
    return dims


# ----------------------------------------------------------------------------- tuning


@dataclass
class TuneOutcome:
    report: dict[str, Any]
    trials: list[Trial]
    best: Trial
    prepare_s: float = 0.0     # building, verifying, warming up and calibrating candidates
    measure_s: float = 0.0     # timed rounds
    total_s: float = 0.0       # everything, including inputs, reference and golden output
    extra: dict[str, Any] = field(default_factory=dict)
    precompiled: str | None = None  # what the backend compiled ahead (None: it compiles at first launch)


def env_for(chip: ChipInfo, backend: Backend, kernel_hash: str) -> dict[str, Any]:
    name = chip.name
    if backend.name == "cpu" and chip.backend == "cuda":  # the CPU of an NVIDIA host is not the GPU
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                name = parse_cpuinfo_model(f.read()) or name
        except OSError:
            pass
    return {"chip": name, "backend": backend.name, "mlx_version": chip.mlx_version, "os": chip.os,
            "driver": chip.driver, "kernel_hash": kernel_hash, "gpu_cores": chip.gpu_cores,
            "memory_bytes": chip.memory_bytes}


def _cap(configs: list[Config], seed: int) -> list[Config]:
    """At most MAX_TRIALS configs: the built-in plus a seeded sample of the rest, in order."""
    if len(configs) <= MAX_TRIALS:
        return configs
    custom = [c for c in configs if config_key(c) != "builtin"]
    keep = set(random.Random(seed).sample(range(len(custom)), MAX_TRIALS - 1))
    return [dict(BUILTIN)] + [c for i, c in enumerate(custom) if i in keep]


def tune_spec(spec: KernelSpec, shape: str | Shape, dtype: str, *, strategy: str = "halving", seed: int = 0,
              budget: float | None = None, backend: str | Backend | None = None,
              progress: Progress | None = None, configs: Sequence[Config] | None = None,
              revision: str | None = None) -> TuneOutcome:
    """Search ``spec``'s candidates on a backend and return the report plus timings.

    ``configs`` overrides the backend's candidate list (the built-in is always added). ``revision``
    (the kernels' source revision) defaults to this install's (:mod:`kernelfleet.worker.revision`).
    """
    t_start = time.perf_counter()
    dims = resolve(spec, shape, dtype)
    search = get_strategy(strategy)
    be = backend if isinstance(backend, Backend) else (get_backend(backend) if backend else detect_backend())
    the_budget = Budget(budget)
    chip = detect_chip()

    if configs is None:
        candidates = be.candidates(spec, dims, dtype)
    else:
        candidates = [dict(BUILTIN)] + [dict(c) for c in configs if config_key(c) != "builtin"]
    if search.name == "model":  # the model strategy measures the first few: expected fastest first
        candidates = prior_order(spec, dims, dtype, candidates)
    else:
        candidates = _cap(candidates, seed)
    keys = [config_key(c) for c in candidates]

    total = max(1, search.planned_steps(len(candidates)))
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total - 1), total)

    with mx.stream(be.device):
        # a backend that compiles ahead (CUDA) does it while numpy makes the inputs
        builds = set(search.builds(keys))
        ahead = be.precompile(spec, [c for c, k in zip(candidates, keys, strict=True) if k in builds],
                              dims, dtype, seed)
        inputs = spec.make_inputs(dims, dtype, seed)
        reference = spec.reference(inputs)
        mx.eval(inputs, reference)
        precompiled = ahead.result() if ahead is not None else None
        measurer = Measurer(spec, be, dims, dtype, inputs, reference, candidates, seed=seed, on_step=step)
        best_key = search.search(keys, measurer, the_budget.start(), random.Random(seed))
        measurer.raise_if_all_failed()
        if best_key is None:
            raise AllCandidatesFailed(f"no candidate of {spec.name} could be measured")
        best = measurer.trials[best_key]
        assert best.fn is not None
        gold = golden(best.fn(inputs))

    trials = measurer.touched()
    report = {
        "kernel": spec.name, "shape": format_shape(dims), "dtype": dtype, "seed": seed,
        "strategy": search.name,
        "env": env_for(chip, be, spec.version),
        "trials": [t.to_report() for t in trials],
        "best_config_key": best_key,
        "golden": gold,
        "measured_at": datetime.now(UTC).isoformat(),
    }
    revision = revision or installed_revision()
    if revision:
        report["revision"] = revision
    if progress is not None:
        progress(total, total)
    return TuneOutcome(report=report, trials=trials, best=best, prepare_s=measurer.prepare_s,
                       measure_s=measurer.measure_s, total_s=time.perf_counter() - t_start,
                       precompiled=precompiled)


def tune(kernel: str, shape: str, dtype: str, *, strategy: str = "halving", seed: int = 0,
         budget: float | None = None, backend: str | None = None,
         progress: Callable[[int, int], None] | None = None, revision: str | None = None) -> dict:
    """Tune catalog kernel ``kernel`` and return the tuning report (shared contract).

    Raises UnknownKernel, BadShape, UnsupportedDtype, UnknownStrategy, UnknownBackend /
    BackendUnavailable for bad input, and AllCandidatesFailed when no candidate is correct.
    ``budget`` is a soft limit in seconds on the search (see ``kernelfleet.worker.search.base``).
    """
    spec = get_spec(kernel)
    return tune_spec(spec, shape, dtype, strategy=strategy, seed=seed, budget=budget, backend=backend,
                     progress=progress, revision=revision).report
