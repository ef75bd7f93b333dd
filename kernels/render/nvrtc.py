"""NVRTC through ctypes: CUDA source to a cubin, in this process or in a pool of processes.

One NVRTC compile of an MLX custom kernel takes about 2 s on an H100 host (the headers MLX's
generated source includes: a bare kernel compiles in 0.04 s), and NVRTC runs the compiles of one
process one at a time: six on six threads took 10.9-14.3 s, no faster than one after another
(``benchmarks/results/h100_tune_time.txt``). So :class:`CompilePool` compiles in processes of its
own, each with its own NVRTC. This module imports nothing of MLX, so those processes start light.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, cast


class NvrtcError(RuntimeError):
    """NVRTC refused a program (the message holds its log) or failed."""


@dataclass(frozen=True)
class Toolchain:
    """Everything a compile needs: NVRTC's library, the options and the in-memory headers."""

    library: str  # path of libnvrtc.so
    options: tuple[str, ...]
    headers: tuple[bytes, ...] = ()  # texts handed to nvrtcCreateProgram
    include_names: tuple[bytes, ...] = ()  # the name each text answers to in an #include


@dataclass(frozen=True)
class Job:
    module: str  # the program's name (its file name in NVRTC's messages)
    source: str
    kernel: str  # the name expression whose lowered (mangled) name is wanted


def version(library: str) -> tuple[int, int]:
    lib = ctypes.CDLL(library)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


class Compiler:
    """One process's NVRTC, set up for a :class:`Toolchain`."""

    def __init__(self, toolchain: Toolchain) -> None:
        self.toolchain = toolchain
        self.lib = ctypes.CDLL(toolchain.library)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise NvrtcError(f"{what}: {self.lib.nvrtcGetErrorString(code).decode()}")

    def compile(self, job: Job) -> tuple[bytes, str]:
        """The cubin of ``job.source`` and the lowered name of ``job.kernel``."""
        lib, prog, tc = self.lib, ctypes.c_void_p(), self.toolchain
        n = len(tc.headers)
        headers = (ctypes.c_char_p * n)(*tc.headers)
        names = (ctypes.c_char_p * n)(*tc.include_names)
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), job.source.encode(),
                                           f"{job.module}.cu".encode(), n, headers, names),
                    "nvrtcCreateProgram")
        try:
            self._check(lib.nvrtcAddNameExpression(prog, job.kernel.encode()), "nvrtcAddNameExpression")
            options = (ctypes.c_char_p * len(tc.options))(*(o.encode() for o in tc.options))
            if lib.nvrtcCompileProgram(prog, len(tc.options), options) != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value + 1)
                lib.nvrtcGetProgramLog(prog, log)
                text = log.value.decode(errors="replace")
                raise NvrtcError(f"NVRTC could not compile {job.module}: {text}")
            lowered = ctypes.c_char_p()
            self._check(lib.nvrtcGetLoweredName(prog, job.kernel.encode(), ctypes.byref(lowered)),
                        "nvrtcGetLoweredName")
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw, (lowered.value or b"").decode()
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


Result = tuple[str, bytes | None, str]  # module, cubin (None: refused), lowered name or the error


def _compile_safely(compiler: Compiler, job: Job) -> Result:
    try:
        cubin, lowered = compiler.compile(job)
        return job.module, cubin, lowered
    except NvrtcError as e:
        return job.module, None, str(e)


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """A compile process's loop (``python -m kernelfleet.kernels.render.nvrtc``): a pickled
    :class:`Toolchain`, then pickled jobs, each answered with a pickled :data:`Result`."""
    compiler = Compiler(pickle.load(stdin))
    while True:
        try:
            job = pickle.load(stdin)
        except EOFError:
            return
        pickle.dump(_compile_safely(compiler, job), stdout)
        stdout.flush()


class _Process:
    """One compile process, talked to over its pipes."""

    def __init__(self, toolchain: Toolchain) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", __name__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.dead = False
        try:
            pickle.dump(toolchain, self.stdin)
            self.stdin.flush()
        except OSError:
            self.dead = True

    def compile(self, job: Job) -> Result:
        try:
            pickle.dump(job, self.stdin)
            self.stdin.flush()
            return cast(Result, pickle.load(self.stdout))
        except (OSError, ValueError, EOFError, pickle.UnpicklingError) as e:  # ValueError: a closed pipe
            self.dead = True
            return job.module, None, f"the compile process ended: {e}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


MAX_PROCESSES = 16  # each process: ~90 MB resident after one compile on the 2-core host (Python, MLX, NVRTC)
IDLE_SECONDS = 120.0  # a pool unused this long lets its processes go (the next call starts them again)


class CompilePool:
    """Up to ``processes`` compiles at once (default: the CPUs, at most :data:`MAX_PROCESSES`), each in
    a process of its own (``python -m`` this module: nothing of the caller's program is imported
    there). The processes stay for the next call -- a tune's compiles come in bursts -- and go after
    ``idle_seconds`` without one."""

    def __init__(self, toolchain: Toolchain, processes: int | None = None,
                 idle_seconds: float | None = IDLE_SECONDS) -> None:
        self.toolchain = toolchain
        self.processes = max(1, processes or min(os.cpu_count() or 1, MAX_PROCESSES))
        self.idle_seconds = idle_seconds
        self._idle: queue.SimpleQueue[_Process] = queue.SimpleQueue()
        self._all: list[_Process] = []
        self._lock = threading.Lock()
        self._busy = 0  # compile calls in progress
        self._timer: threading.Timer | None = None

    def _take(self) -> _Process:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            with self._lock:
                if len(self._all) < self.processes:
                    proc = _Process(self.toolchain)
                    self._all.append(proc)
                    return proc
            return self._idle.get()

    def _run(self, job: Job) -> Result:
        proc = self._take()
        try:
            return proc.compile(job)
        finally:
            if not proc.dead and proc.proc.poll() is None:
                self._idle.put(proc)
            else:  # it died (NVRTC crashed, or could not load): the next job starts a new one
                with self._lock:
                    self._all.remove(proc)
                proc.close()

    def compile(self, jobs: Iterable[Job]) -> list[Result]:
        """Each job's result, in order."""
        todo = list(jobs)
        if not todo:
            return []
        with self._lock:
            self._busy += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        try:
            with ThreadPoolExecutor(max_workers=min(len(todo), self.processes)) as waiters:
                return list(waiters.map(self._run, todo))
        finally:
            with self._lock:
                self._busy -= 1
                if self._busy == 0 and self.idle_seconds is not None:
                    self._timer = threading.Timer(self.idle_seconds, self._close_if_idle)
                    self._timer.daemon = True
                    self._timer.start()

    def running(self) -> int:
        """How many compile processes are up."""
        with self._lock:
            return len(self._all)

    def _close_if_idle(self) -> None:
        with self._lock:
            if self._busy == 0:
                self._stop_all()

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._stop_all()

    def _stop_all(self) -> None:  # under the lock
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                break
        for proc in self._all:
            proc.close()
        self._all.clear()


if __name__ == "__main__":
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed here goes to stderr, never into the results
    serve(sys.stdin.buffer, protocol)
