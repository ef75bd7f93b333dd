"""Host time one call adds to a graph being built: MLX's own ops, the catalog's built-ins and a custom
kernel through :mod:`kernelfleet.kernels.patch.runtime`, with evaluated and with un-evaluated (lazy) inputs.

    python benchmarks/host_cost.py        # on a GPU host: see benchmarks/model.py for the PYTHONPATH

A patched model pays at least this on every call its patch routes. Timed alone, on an idle GPU; inside
a model's decode step a custom call added 22-56 µs (``benchmarks/patch_cost.py``), and their median,
36 µs, is ``profile_view.ROUTED_MIN_GAIN_US``: below that gain a call, ``kernelfleet.patch`` keeps the
built-in (quantized layers, called by a leaner path, have their own gate: ``DEFAULT_MIN_GAIN_US``).
Only the graph building is timed (the calls are evaluated afterwards); best of 5 rounds of 400 calls.

``chains()`` prices one MLX primitive of each kind a decode step is made of, building and evaluating: a
chain of 800 (each on the last one's output) built from Python (build), handed to ``mx.async_eval``
(submit: MLX's host work, CUDA graph nodes included) and waited on (wait: what the GPU adds after that).
A step whose wait is near zero is host time: its cost is the sum of build and submit over its primitives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from kernelfleet.kernels.catalog.add_rmsnorm_kernel import _compiled
from kernelfleet.kernels.patch import runtime

N = 400
EPS = 1e-5


def per_call(label: str, make_inputs: Callable[[], tuple[Any, ...]], fn: Callable[..., Any]) -> None:
    best = float("inf")
    for _ in range(5):
        ins = [make_inputs() for _ in range(N)]
        t0 = time.perf_counter()
        outs = [fn(*i) for i in ins]
        t1 = time.perf_counter()
        mx.eval(outs)
        best = min(best, (t1 - t0) / N)
    print(f"  {label:60} {best * 1e6:8.2f} µs host per call", flush=True)


def add_rmsnorm(rows: int) -> None:
    x0 = mx.random.normal((rows, 4096)).astype(mx.bfloat16)
    r0 = mx.random.normal((rows, 4096)).astype(mx.bfloat16)
    w = mx.ones((4096,), mx.bfloat16)
    mx.eval(x0, r0, w)
    cfg = {"rpg": 1, "tg": 256, "vec": 8}
    calls: dict[str, Callable[[mx.array, mx.array], Any]] = {
        "make inputs only": lambda x, r: None,
        "x + r; mx.fast.rms_norm": lambda x, r: mx.fast.rms_norm(x + r, w, EPS),
        "mx.compile'd (x + r, rms_norm)": lambda x, r: _compiled(EPS)(x, r, w),
        "runtime.builtin add_rmsnorm": lambda x, r: runtime.builtin("add_rmsnorm", [x, r, w], eps=EPS),
        "runtime.run add_rmsnorm custom":
            lambda x, r: runtime.run("add_rmsnorm", [x, r, w], (rows, 4096), cfg, eps=EPS),
    }
    inputs: dict[str, Callable[[], tuple[mx.array, mx.array]]] = {
        "evaluated": lambda: (x0, r0),
        "lazy": lambda: (x0 * 1, r0 * 1),  # graph outputs, as inside a model's forward
    }
    print(f"rows {rows} x 4096 bf16")
    for name, make in inputs.items():
        for label, fn in calls.items():
            per_call(f"[{name}] {label}", make, fn)


def rope() -> None:
    x = mx.random.normal((1, 32, 2048, 128)).astype(mx.bfloat16)
    mx.eval(x)
    off = mx.array([0], mx.int32)
    per_call("mx.array([int], mx.int32)", lambda: (5,), lambda o: mx.array([o], mx.int32))
    per_call("mx.fast.rope int offset", lambda: (x * 1,),
             lambda a: mx.fast.rope(a, 128, traditional=False, base=5e5, scale=1.0, offset=0))
    per_call("runtime.builtin rope (array offset)", lambda: (x * 1,),
             lambda a: runtime.builtin("rope", [a, off], base=5e5))
    per_call("runtime.builtin rope (new array offset)", lambda: (x * 1,),
             lambda a: runtime.builtin("rope", [a, mx.array([0], mx.int32)], base=5e5))


CHAIN = 800


def chains() -> None:
    from kernelfleet.kernels.catalog import quantized_matmul_kernel as qmm

    x = mx.random.normal((1, 4096)).astype(mx.bfloat16)
    w = mx.ones((4096,), mx.bfloat16)
    shape = (1, 4096, 4096, 4, 64)
    _, wq, sc, bi = qmm.make_inputs(shape, "bfloat16", 1)
    mx.eval(x, w, wq, sc, bi)
    # a catalog kernel as kernelfleet.patch runs it (one compiled graph a call); the H200's pick at M=1
    custom = runtime.resolve("quantized_matmul", shape, "bfloat16",
                             {"path": "qmv_split", "rpw": 4, "tg": 64, "unr": 1, "vw": 4}, {})
    add = mx.compile(lambda a, b: a + b)
    kinds: dict[str, tuple[int, Callable[[mx.array], mx.array]]] = {  # primitives a link, the link
        "Reshape (a view)": (2, lambda y: y.reshape(4096, 1).reshape(1, 4096)),
        "Add": (1, lambda y: y + x),
        "Add, one mx.compile'd call": (1, lambda y: add(y, x)),
        "RMSNorm (mx.fast.rms_norm)": (1, lambda y: mx.fast.rms_norm(y, w, EPS)),
        "QuantizedMatmul (MLX, 4096x4096 4-bit)": (1, lambda y: mx.quantized_matmul(
            y, wq, sc, bi, transpose=True, group_size=64, bits=4)),
        "CustomKernel (qmv_split, compiled call)": (1, lambda y: custom([y, wq, sc, bi])[0]),
    }
    print(f"a chain of {CHAIN} links, median of 5 rounds after one: µs a primitive")
    for label, (per, link) in kinds.items():
        rounds = []
        for _ in range(6):
            t0 = time.perf_counter()
            y = x
            for _ in range(CHAIN):
                y = link(y)
            t1 = time.perf_counter()
            mx.async_eval(y)
            t2 = time.perf_counter()
            mx.eval(y)
            rounds.append((t1 - t0, time.perf_counter() - t2, t2 - t1))
        build, wait, submit = (sorted(r[i] for r in rounds[1:])[2] / (CHAIN * per) * 1e6 for i in range(3))
        print(f"  {label:44} build {build:6.2f}  submit {submit:6.2f}  wait {wait:6.2f}", flush=True)


if __name__ == "__main__":
    print(f"device: {runtime.target().chip}")
    for rows in (8, 2048):
        add_rmsnorm(rows)
    rope()
    chains()
