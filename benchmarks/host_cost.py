"""Host time one call adds to a graph being built: MLX's own ops, the catalog's built-ins and a custom
kernel through :mod:`kernelfleet.kernels.patch.runtime`, with evaluated and with un-evaluated (lazy) inputs.

    python benchmarks/host_cost.py        # on a GPU host: see benchmarks/model.py for the PYTHONPATH

A patched model pays at least this on every call its patch routes. Timed alone, on an idle GPU; inside
a model's decode step a custom call added 22-56 µs (``benchmarks/patch_cost.py``), and their median,
36 µs, is ``profile_view.ROUTED_MIN_GAIN_US``: below that gain a call, ``kernelfleet.patch`` keeps the
built-in (quantized layers, called by a leaner path, have their own gate: ``DEFAULT_MIN_GAIN_US``).
Only the graph building is timed (the calls are evaluated afterwards); best of 5 rounds of 400 calls.
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


if __name__ == "__main__":
    print(f"device: {runtime.target().chip}")
    for rows in (8, 2048):
        add_rmsnorm(rows)
    rope()
