"""``metal-emu``: a Backend that runs the Metal kernels of the catalog on the CPU emulator, checked
like any GPU backend (the catalog test, the Measurer). Not in the worker's registry: it is never
detected or offered for tuning (its timings mean nothing); tests construct it.

``max_threads_per_threadgroup`` models a chip's per-pipeline limit: a larger threadgroup raises the
ValueError MLX raises on a Mac (mlx/backend/metal/custom_kernel.cpp), with its exact text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from kernelfleet.kernels.render.launch import LaunchRecord, intercept
from kernelfleet.kernels.spec import Config, KernelFn, KernelSpec, Shape, config_key
from kernelfleet.kernels.testing.metal_emu import Emulator
from kernelfleet.kernels.testing.mlx_metal import from_record, type_string
from kernelfleet.kernels.testing.msl_clang import clang_path
from kernelfleet.worker.backends.base import Backend
from kernelfleet.worker.backends.metal import threadgroup_limit_reason


def to_numpy(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


def from_numpy(a: np.ndarray, dtype: mx.Dtype) -> mx.array:
    return mx.array(a).view(mx.bfloat16) if dtype == mx.bfloat16 else mx.array(a)


class MetalEmuBackend(Backend):
    name = "metal-emu"
    supports_custom_kernels = True

    def __init__(self, emulator: Emulator | None = None, *, max_threads_per_threadgroup: int = 1024,
                 group_stride: int = 1) -> None:
        self.emulator = emulator
        self.max_threads = max_threads_per_threadgroup
        self.group_stride = group_stride
        self.launches = 0

    def available(self) -> bool:
        return clang_path() is not None

    @property
    def device(self) -> mx.Device:
        return mx.Device(mx.cpu)

    def unsupported_reason(self, error: BaseException) -> str | None:
        if "Currently only supports float32" in str(error):  # e.g. [GatherMM::eval] on MLX 0.32.4
            return ("an MLX op beside the kernel runs on MLX's CPU backend here, which takes float32 only "
                    "(on a Mac it runs on the GPU)")
        return threadgroup_limit_reason(error)

    def prepare(self, spec: KernelSpec, shapes: Sequence[Shape], dtype: str,
                configs: Sequence[Config] | None = None) -> int:
        """Compile, in batches, every kernel the configs (default: the whole space) launch at these
        shapes, so that their launches do not compile one kernel at a time. The kernel count."""
        from kernelfleet.kernels.common import shapes_only
        from kernelfleet.kernels.render.launch import capture

        kernels = {}
        for shape in shapes:
            with shapes_only():
                inputs = spec.make_inputs(shape, dtype, 0)
            for config in spec.space_for(shape, dtype, "metal") if configs is None else configs:
                with capture() as recs:
                    spec.build(config, "metal", shape, dtype)(inputs)
                for rec in recs:
                    k = from_record(rec)
                    kernels[k.name] = k
        if self.emulator is None:
            self.emulator = Emulator()
        self.emulator.build(list(kernels.values()))
        return len(kernels)

    def build(self, spec: KernelSpec, config: Config, shape: Shape, dtype: str) -> KernelFn:
        if config_key(config) == "builtin":
            return spec.builtin
        fn = spec.build(config, "metal", shape, dtype)

        def call(inputs: Sequence[mx.array]) -> list[mx.array]:
            with intercept(self.launch):
                return fn(inputs)

        return call

    def launch(self, rec: LaunchRecord, inputs: Sequence[mx.array]) -> list[mx.array]:
        """Run one captured launch on the emulator (MLX's checks first)."""
        tg = math.prod(rec.launch.threadgroup)
        if tg > self.max_threads:  # MLX's message, double space included
            raise ValueError(f"Thread group size ({tg}) is greater than  the maximum allowed threads per "
                             f"threadgroup ({self.max_threads}).")
        if self.emulator is None:
            self.emulator = Emulator()
        kernel = from_record(rec)
        outs = self.emulator.run(
            kernel, [to_numpy(a) for a in inputs],
            [(s, type_string(d)) for s, d in zip(rec.output_shapes, rec.output_dtypes, strict=True)],
            rec.launch.grid, rec.launch.threadgroup, group_stride=self.group_stride)
        self.launches += 1
        return [from_numpy(o, d) for o, d in zip(outs, rec.output_dtypes, strict=True)]
