"""The CPU emulator of Metal's execution model: MLX's exact kernel text, compiled by clang as C++
against ``msl.h`` (emulate mode) and ``emu_runtime.h`` (fibers, rendezvous barriers and SIMD-group
functions, shared threadgroup memory, guard pages, NaN-filled outputs; see that header).

Kernels are compiled in batches into one executable per unit (cached on disk by the hash of its
text); a launch runs in its own process, so a memory fault is a reported error, not a crash.

``Emulator().run(kernel, inputs, outputs, grid, threadgroup)`` is the entry point; ``emulate``
does the same with a default emulator.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .mlx_metal import MetalKernel
from .msl_clang import INCLUDE_DIR, RewriteError, clang_path, for_clang

EMU_FLAGS = ("-std=c++17", "-O0", "-x", "c++", "-w", "-fno-strict-aliasing", "-ffp-contract=off",
             "-DKF_MSL_EMULATE")
MAX_THREADS_PER_THREADGROUP = 1024

# element type as MLX writes it -> numpy dtype of its bytes (bfloat16 travels as raw uint16)
NUMPY: dict[str, np.dtype] = {
    "float": np.dtype(np.float32), "float16_t": np.dtype(np.float16), "bfloat16_t": np.dtype(np.uint16),
    "uint32_t": np.dtype(np.uint32), "int32_t": np.dtype(np.int32), "uint8_t": np.dtype(np.uint8),
    "int8_t": np.dtype(np.int8), "uint16_t": np.dtype(np.uint16), "int16_t": np.dtype(np.int16),
    "int64_t": np.dtype(np.int64), "uint64_t": np.dtype(np.uint64), "bool": np.dtype(np.bool_),
}


class EmulationError(RuntimeError):
    """The kernel did something Metal does not allow or define (a barrier or SIMD-group call reached
    by only some threads, an access outside a buffer ...), or could not be built."""


def _entry(k: MetalKernel, index: int) -> str:
    args = []
    for i, b in enumerate(k.buffers):
        const = "" if b.kind == "output" else "const "
        args.append(f"*({const}{b.ctype}*)b[{i}]" if b.scalar else f"({const}{b.ctype}*)b[{i}]")
    args += [f"a.{name}" for name, _ in k.attributes]
    return (f"static void kf_entry_{index}(void** b, const kf_emu::Attrs& a) {{\n"
            f"  {k.call_name}({', '.join(args)});\n}}\n")


def unit_text(kernels: Sequence[MetalKernel]) -> str:
    """One C++ unit: the runtime, each distinct header once (in a namespace of its own) followed by
    its kernels and their entry points, the kernel table and ``main``."""
    by_header: dict[str, list[MetalKernel]] = {}
    for k in kernels:
        by_header.setdefault(k.header, []).append(k)
    parts = ['#include "msl.h"\n#include "emu_runtime.h"\n']
    table = []
    n = 0
    for h, (header, group) in enumerate(by_header.items()):
        parts.append(f"namespace kf_header_{h} {{\n{for_clang(header, kernel=False)}\n")
        for k in group:
            parts.append(for_clang(k.text[len(header):]) + "\n" + _entry(k, n))
            table.append(f'  {{"{k.name}", &kf_header_{h}::kf_entry_{n}}},\n')
            n += 1
        parts.append("}\n")
    parts.append("static const kf_emu::Kernel KF_KERNELS[] = {\n" + "".join(table) + "};\n"
                 f"int main(int argc, char** argv) {{ return kf_emu::main(argc, argv, KF_KERNELS, {n}); }}\n")
    return "".join(parts)


def _default_cache() -> Path:
    return Path(os.environ.get("KF_METAL_EMU_CACHE") or
                Path(tempfile.gettempdir()) / f"kernelfleet-metal-emu-{os.getuid()}")


class Emulator:
    """Builds kernels into executables (batches of ``per_unit``, ``jobs`` clang processes at once)
    and runs launches. ``seed``: shuffle thread and group order (0: in order). ``run_ahead``: the
    run-ahead schedule (emu_runtime.h): in each threadgroup one SIMD-group runs past the others'
    SIMD-group calls up to a barrier before they move, which shows write-after-read races on
    threadgroup memory that running every thread until it blocks never does."""

    def __init__(self, cache_dir: Path | None = None, *, jobs: int | None = None, per_unit: int = 60,
                 seed: int = 0, run_ahead: bool = False, timeout_s: float = 120.0) -> None:
        clang = clang_path()
        if clang is None:
            raise EmulationError("clang++ is not on PATH (Debian: apt-get install clang)")
        self.clang = clang
        self.cache = cache_dir or _default_cache()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.jobs, self.per_unit = jobs or os.cpu_count() or 1, per_unit
        self.seed, self.run_ahead, self.timeout_s = seed, run_ahead, timeout_s
        self.exe: dict[str, Path] = {}  # kernel name -> executable holding it
        self.build_s = 0.0
        self.compiled_units = 0

    @property
    def schedule(self) -> str:
        """The schedule's name, as the job file and test output spell it."""
        return "run-ahead" if self.run_ahead else ("shuffled" if self.seed else "in-order")

    def build(self, kernels: Sequence[MetalKernel]) -> None:
        """Compile every kernel not built yet (a unit already in the cache is reused)."""
        import time

        todo: dict[str, MetalKernel] = {}
        for k in kernels:
            if k.name not in self.exe:
                todo.setdefault(k.name, k)
        if not todo:
            return
        t0 = time.perf_counter()
        ks = list(todo.values())
        batches = [ks[i:i + self.per_unit] for i in range(0, len(ks), self.per_unit)]
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            for batch, exe in zip(batches, pool.map(self._compile, batches), strict=True):
                for k in batch:
                    self.exe[k.name] = exe
        self.build_s += time.perf_counter() - t0

    def _compile(self, batch: Sequence[MetalKernel]) -> Path:
        try:
            text = unit_text(batch)
        except RewriteError as e:
            raise EmulationError(str(e)) from e
        runtime = (INCLUDE_DIR / "msl.h").read_bytes() + (INCLUDE_DIR / "emu_runtime.h").read_bytes()
        key = hashlib.sha256(text.encode() + runtime + " ".join(EMU_FLAGS).encode()).hexdigest()[:20]
        exe = self.cache / f"unit-{key}"
        if exe.exists():
            return exe
        tmp = exe.with_suffix(f".tmp{os.getpid()}")
        proc = subprocess.run([self.clang, *EMU_FLAGS, f"-I{INCLUDE_DIR}", "-", "-o", str(tmp)], input=text,
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise EmulationError(f"the emulator could not compile {[k.name for k in batch][:3]}...:\n"
                                 + proc.stderr[:4000])
        tmp.replace(exe)
        self.compiled_units += 1
        return exe

    def run(self, kernel: MetalKernel, inputs: Sequence[np.ndarray],
            outputs: Sequence[tuple[Sequence[int], str]], grid: Sequence[int], threadgroup: Sequence[int], *,
            group_stride: int = 1) -> list[np.ndarray]:
        """Run one launch. ``inputs``: arrays in MLX's input order (bfloat16 as raw uint16);
        ``outputs``: (shape, element type as MLX writes it, e.g. "float" or "bfloat16_t").
        ``group_stride`` k > 1 runs every k-th threadgroup (and the last) only, for large shapes;
        elements the skipped groups own stay NaN (0xFF bytes). Raises EmulationError."""
        if math.prod(threadgroup) > MAX_THREADS_PER_THREADGROUP:
            raise EmulationError(f"threadgroup {tuple(threadgroup)} has more than "
                                 f"{MAX_THREADS_PER_THREADGROUP} threads")
        self.build([kernel])
        arrays = [np.ascontiguousarray(a) for a in inputs]
        with tempfile.TemporaryDirectory(prefix="kf-emu-", dir=_shm()) as d:
            job = [f"kernel {kernel.name}", "grid " + " ".join(map(str, grid)),
                   "threadgroup " + " ".join(map(str, threadgroup)), f"seed {self.seed}",
                   f"group_stride {group_stride}", f"schedule {self.schedule}"]
            out_paths: list[tuple[Path, Sequence[int], str]] = []
            for i, b in enumerate(kernel.buffers):
                path = Path(d) / f"b{i}"
                if b.kind == "output":
                    shape, ctype = outputs[len(out_paths)]
                    out_paths.append((path, shape, ctype))
                    job.append(f"buffer out {math.prod(shape) * NUMPY[ctype].itemsize} {path} {b.name}")
                    continue
                n_before = sum(1 for x in kernel.buffers[:i] if x.kind == "input")
                a = arrays[b.of] if b.of >= 0 else arrays[n_before]
                data = {"input": a, "shape": np.array(a.shape, np.int32),
                        "strides": np.array([math.prod(a.shape[j + 1:]) for j in range(a.ndim)], np.int64),
                        "ndim": np.array(a.ndim, np.int32)}[b.kind]
                path.write_bytes(data.tobytes())
                job.append(f"buffer in {data.nbytes} {path} {b.name}")
            (Path(d) / "job").write_text("\n".join(job) + "\n")
            try:
                proc = subprocess.run([str(self.exe[kernel.name]), str(Path(d) / "job")], capture_output=True,
                                      text=True, timeout=self.timeout_s)
            except subprocess.TimeoutExpired as e:
                raise EmulationError(f"{kernel.name}: no result in {self.timeout_s:.0f} s (a hang?)") from e
            if proc.returncode != 0 or not proc.stdout.startswith("ok"):
                detail = (proc.stdout + proc.stderr).strip() or f"exit status {proc.returncode}"
                raise EmulationError(detail[:2000])
            return [np.frombuffer(p.read_bytes(), NUMPY[ct]).reshape(tuple(shape)).copy()
                    for p, shape, ct in out_paths]


def _shm() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


_default: Emulator | None = None


def emulate(kernel: MetalKernel, inputs: Sequence[np.ndarray], outputs: Sequence[tuple[Sequence[int], str]],
            grid: Sequence[int], threadgroup: Sequence[int]) -> list[np.ndarray]:
    """:meth:`Emulator.run` on a shared default emulator (in-order threads)."""
    global _default
    if _default is None:
        _default = Emulator()
    return _default.run(kernel, inputs, outputs, grid, threadgroup)
