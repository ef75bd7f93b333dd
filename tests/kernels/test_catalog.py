"""THE catalog test: every kernel x dtype x available backend; the built-in and every rendered
candidate of the parameter space match the float32 reference within the dtype's tolerance.

CPU runs the built-in only (MLX has no custom CPU kernels); CUDA, Metal and ``metal-emu`` (Metal's
execution model emulated on the CPU, the exact MSL compiled by clang: kernels/testing) also run every
config of the space for each test shape (``metal-emu``: a rotating third of it a day, all of it under
``make test-full``; half the kernel x dtype tests a day under the emulator's run-ahead schedule,
the others in thread order). GPU params carry the ``cuda`` / ``metal`` markers and skip
cleanly when that backend is absent. A config the chip cannot run (Metal: a threadgroup over the
pipeline's maxTotalThreadsPerThreadgroup) is skipped with the backend's reason, as the tuner
records it ``unsupported``."""

from __future__ import annotations

import functools
import os

import mlx.core as mx
import pytest
from sampling import covered, rotating, seed

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.spec import BUILTIN, DTYPES, config_key
from kernelfleet.kernels.testing.metal_emu import Emulator
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend
from kernelfleet.worker.backends.registry import get_backend

BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
    pytest.param("metal", id="metal", marks=pytest.mark.metal),
    # Metal's execution model on the CPU: the exact MSL, compiled with clang (kernels/testing)
    pytest.param("metal-emu", id="metal-emu", marks=pytest.mark.slow),
]


def _available(backend: str) -> bool:
    if backend == "cuda":
        return bool(mx.cuda.is_available())
    if backend == "metal":
        return bool(mx.metal.is_available())
    if backend == "metal-emu":
        return MetalEmuBackend().available()
    return True


# metal-emu runs a third of each test shape's space a day (tests/sampling.py), so three days cover it
# all; make test-full runs all of it. (Each config also compiles under the strict MSL model, at every
# shape, in tests/kernels/test_metal_render.py.)
EMU_SHARE = 3


@functools.cache
def _emulator(run_ahead: bool) -> Emulator:
    # KF_METAL_EMU_ORDER=<seed> shuffles thread and threadgroup order (default: in order)
    return Emulator(seed=int(os.environ.get("KF_METAL_EMU_ORDER") or 0), run_ahead=run_ahead)


def _run_ahead(name: str, dtype: str) -> bool:
    """Whether a kernel x dtype runs under the emulator's run-ahead schedule today (it shows
    write-after-read races on threadgroup memory; the in-order one, reads before a missing barrier's
    writes): half the tests a day, alternating, so each config meets both within six days.
    KF_METAL_EMU_SCHEDULE=run-ahead|in-order pins it."""
    pinned = os.environ.get("KF_METAL_EMU_SCHEDULE", "")
    if pinned:
        return pinned == "run-ahead"
    return (seed() + NAMES.index(name) + DTYPES.index(dtype)) % 2 == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_catalog(name: str, dtype: str, backend: str) -> None:
    if not _available(backend):
        pytest.skip(f"MLX {backend} backend not available on this machine")
    spec = get_spec(name)
    if dtype not in spec.dtypes:
        pytest.skip(f"{name} does not support {dtype}")
    assert spec.test_shapes
    failures: list[str] = []
    unsupported: list[str] = []
    checked = 0
    device = mx.gpu if backend in ("cuda", "metal") else mx.cpu
    emu = _emulator(_run_ahead(name, dtype)) if backend == "metal-emu" else None
    runner = MetalEmuBackend(emu) if emu is not None else get_backend(backend)
    kernel_backend = "cuda" if backend == "cuda" else "metal"
    spaces = {shape: spec.space_for(shape, dtype, kernel_backend) for shape in spec.test_shapes}
    if isinstance(runner, MetalEmuBackend):  # a rotating share of each space; its kernels compiled first
        sizes = sum(len(c) for c in spaces.values())
        spaces = {shape: rotating(c, -(-len(c) // EMU_SHARE), f"{name}-{dtype}-{shape}")
                  for shape, c in spaces.items()}
        print(covered(f"{name} {dtype} metal-emu configs ({emu.schedule if emu else ''} schedule)",
                      sum(len(c) for c in spaces.values()), sizes))
        for shape, configs in spaces.items():
            runner.prepare(spec, [shape], dtype, configs)
    with mx.stream(device):
        for shape in spec.test_shapes:
            if backend == "cuda":  # NVRTC-compile the shape's whole space at once, as the tuner does
                ahead = runner.precompile(spec, spaces[shape], shape, dtype, 0)
                if ahead is not None:
                    print(f"{name} {shape} {dtype}: {ahead.result()}")
            inputs = spec.make_inputs(shape, dtype, 0)
            ref = spec.reference(inputs)
            mx.eval(ref)
            candidates = [("builtin", None)]
            if backend != "cpu":
                configs = spaces[shape]
                assert configs, f"{name} {shape} {dtype}: empty parameter space"
                candidates += [(config_key(c), c) for c in configs]
            for key, config in candidates:
                try:  # built the way the tuner and the runtime build it (one compiled graph on a GPU)
                    outs = runner.build(spec, BUILTIN if config is None else config, shape, dtype)(inputs)
                    mx.eval(outs)
                except Exception as e:  # a failing candidate is a test failure, reported with the rest
                    reason = runner.unsupported_reason(e)
                    if reason is not None:
                        unsupported.append(f"{shape} {key}: {reason}")
                    else:
                        failures.append(f"{shape} {key}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                cmp = spec.compare(outs, ref, dtype)
                checked += 1
                if not cmp.ok:
                    failures.append(f"{shape} {key}: {cmp.detail} (max abs {cmp.max_abs_err:.3g})")
    if unsupported:
        print(f"{name} {dtype} {backend}: skipped {len(unsupported)} configs this chip cannot run:\n"
              + "\n".join(unsupported))
    total = checked + len(failures)
    summary = f"{name} {dtype} {backend}: {len(failures)} of {total} failed:\n"
    assert not failures, summary + "\n".join(failures[:40])
