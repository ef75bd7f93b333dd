"""NVIDIA GPUs through MLX's CUDA backend (custom kernels via mx.fast.cuda_kernel)."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import mlx.core as mx

from kernelfleet.chips import detect_chip
from kernelfleet.kernels.common import shapes_only
from kernelfleet.kernels.render import cuda_precompile
from kernelfleet.kernels.spec import Config, KernelBuildError, KernelSpec, Shape, config_key
from kernelfleet.worker.backends.base import Backend

PRECOMPILE_ENV = "KERNELFLEET_CUDA_PRECOMPILE"  # "0": compile each kernel at its first launch, as MLX does


class CudaBackend(Backend):
    name = "cuda"
    supports_custom_kernels = True

    def available(self) -> bool:
        cuda = getattr(mx, "cuda", None)
        return bool(cuda is not None and cuda.is_available())

    def precompile(self, spec: KernelSpec, configs: Sequence[Config], shape: Shape, dtype: str,
                   seed: int) -> Future[str] | None:
        """NVRTC-compile the custom configs' kernels, all at once in a pool of processes, into MLX's
        PTX cache (:mod:`kernelfleet.kernels.render.cuda_precompile`) while the caller goes on (the tuner
        makes its inputs and reference meanwhile). The launches are captured here, on the caller's
        thread, with inputs of the right shapes and dtypes that hold nothing (``shapes_only``: numpy
        takes seconds for a large shape); a helper thread only waits for the pool and writes files."""
        if os.environ.get(PRECOMPILE_ENV, "1") == "0":
            return None
        with shapes_only():
            inputs = spec.make_inputs(shape, dtype, seed)
        calls = []
        for config in configs:
            if config_key(config) == "builtin":
                continue
            try:
                calls.append((spec.build(config, self.name, shape, dtype), inputs))
            except KernelBuildError:
                continue  # the measurer records it when it builds the config
        arch = detect_chip().arch or ""  # cached: the tuner has asked already
        future: Future[str] = Future()
        try:
            records = cuda_precompile.records_of(calls)
            cuda_precompile.toolchain(arch)  # on this thread: it touches MLX once
        except (cuda_precompile.NvrtcUnavailable, KernelBuildError, RuntimeError, ValueError) as e:
            future.set_result(f"not precompiled: {e}")
            return future

        def work() -> None:
            try:
                done = cuda_precompile.precompile(records, arch)
                failed = f", {len(done.failed)} refused by NVRTC" if done.failed else ""
                future.set_result(f"{done.compiled} compiled ahead in {done.seconds:.1f} s, "
                                  f"{done.cached} already cached{failed}")
            except Exception as e:  # noqa: BLE001 - the launches compile as before; say why
                future.set_result(f"not precompiled: {e}")

        threading.Thread(target=work, name="kf-precompile", daemon=True).start()
        return future
