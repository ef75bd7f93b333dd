"""What a round's length and ``mx.compile`` do to per-launch medians on a GPU, side by side.

For each case (a device copy at three sizes, then catalog kernels at their large and decode shapes,
each with one fixed config) four callables are timed, all interleaved in shuffled order in one run:
our kernel plain (``spec.build``), our kernel compiled (``kernels.launch.compiled_call``, how the
tuner and the runtime run it), the MLX built-in plain and the built-in compiled. Each is timed
with rounds lasting at least 1, 4 and 16 ms (K launches between two ``mx.synchronize()`` calls).

Why: every round pays a fixed cost to start and drain MLX's queue, so short rounds inflate a large
kernel's median; and calling an ``mx.fast`` custom kernel from Python rebuilds its source text each
time, which a compiled graph skips. Every output is checked against the float32 reference first.

    python benchmarks/launch_floor.py [--rounds 30] [--out FILE]   # on a GPU host (MLX CUDA or Metal)
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from kernelfleet.chips import detect_chip
from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.render.launch import compiled_call
from kernelfleet.kernels.spec import BUILTIN, parse_config_key
from kernelfleet.worker.backends.registry import detect_backend

_spec = importlib.util.spec_from_file_location("kf_bench_kernels", Path(__file__).with_name("kernels.py"))
assert _spec and _spec.loader
kb: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kb)  # the copy kernel the kernel table measures bandwidth with

ROUND_MS = (1, 4, 16)
CASES = [  # (kernel, shape, config): the configs the H100 table run picked
    ("layernorm", (16384, 8192), "rpg=1,tg=512,vec=1"), ("logsumexp", (16384, 8192), "rpg=1,tg=256,vec=1"),
    ("softmax", (16384, 8192), "rpg=1,tg=256,vec=1"), ("swiglu", (4096, 14336), "ipt=1,tg=128,vec=4"),
    ("bias_gelu", (4096, 14336), "ipt=2,tg=64,vec=8"),
    ("int4_dequantize", (8192, 8192), "ipt=1,tg=128,vec=1"),
    ("rmsnorm", (16384, 8192), "rpg=1,tg=512,vec=8"), ("rmsnorm", (4096, 4096), "rpg=1,tg=512,vec=8"),
    ("layernorm", (4096, 4096), "rpg=1,tg=128,vec=8"), ("logsumexp", (4096, 4096), "rpg=1,tg=256,vec=1"),
    ("softmax", (4096, 4096), "rpg=2,tg=256,vec=1"), ("rope", (32, 4096, 128), "ipt=1,tg=64,vec=4"),
    ("rmsnorm", (32, 4096), "rpg=1,tg=512,vec=8"), ("swiglu", (32, 14336), "ipt=1,tg=128,vec=4"),
]
def _per_launch(fn: Callable[[], Any], n: int) -> float:
    mx.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        mx.async_eval(fn())
    mx.synchronize()
    return (time.perf_counter() - t0) / n


def interleave(fns: dict[str, Callable[[], Any]], rounds: int, seed: int = 0) -> dict[tuple[str, int], float]:
    """Median µs per launch of each (callable, round length in ms), all rounds shuffled together."""
    ks: dict[tuple[str, int], int] = {}
    for name, fn in fns.items():
        mx.eval(fn())
        _per_launch(fn, 4)
        t = min(_per_launch(fn, 8) for _ in range(3))
        for ms in ROUND_MS:
            ks[(name, ms)] = max(1, math.ceil(ms * 1e-3 / t))
    samples: dict[tuple[str, int], list[float]] = {k: [] for k in ks}
    order = list(ks)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for key in order:
            samples[key].append(_per_launch(fns[key[0]], ks[key]) * 1e6)
    return {k: sorted(s)[len(s) // 2] for k, s in samples.items()}


def _row(label: str, nbytes: int, med: dict[tuple[str, int], float], names: Sequence[str]) -> list[str]:
    lines = []
    for name in names:
        cells = "".join(f"{med[(name, ms)]:>10.2f} {nbytes / med[(name, ms)] / 1e3:>6.0f}" for ms in ROUND_MS)
        ratio = med[(name, 1)] / med[(name, 16)]
        lines.append(f"{label:<46} {name:<17}{cells}   {ratio:>5.3f}")
        label = ""
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", help="write the table here too")
    args = ap.parse_args(argv)
    be = detect_backend()
    if not be.supports_custom_kernels:
        print(f"launch_floor needs a GPU backend with custom kernels; this machine has {be.name}",
              file=sys.stderr)
        return 2
    chip = detect_chip()
    cols = "".join(f"{f'µs @{ms}ms':>10} {'GB/s':>6}" for ms in ROUND_MS)
    lines = [f"# {chip.name} ({chip.arch}), backend {be.name}, MLX {chip.mlx_version}, driver {chip.driver}; "
             f"{args.rounds} interleaved rounds per row group",
             f"{'case':<46} {'callable':<17}{cols}   1ms/16ms"]
    copy = kb.copy_kernel(be.name)  # the copy the kernel table's bandwidth limit comes from

    def plain(xs: Sequence[mx.array]) -> list[mx.array]:
        return [copy(xs[0])]

    comp = compiled_call(plain)
    for mb in (1024, 256, 64):
        nbytes = mb << 20
        x = mx.random.uniform(shape=(nbytes // 4,), dtype=mx.float32)
        if not (mx.array_equal(plain([x])[0], x).item() and mx.array_equal(comp([x])[0], x).item()):
            raise SystemExit("the copy kernel did not copy")
        med = interleave({"plain": functools.partial(plain, [x]), "compiled": functools.partial(comp, [x])},
                         args.rounds)
        lines += _row(f"copy {mb} MiB (read + write)", 2 * nbytes, med, ["plain", "compiled"])
        print("\n".join(lines[-2:]), flush=True)
    names = ["ours plain", "ours compiled", "built-in", "built-in compiled"]
    for kernel, shape, key in CASES:
        spec = get_spec(kernel)
        inputs = spec.make_inputs(shape, args.dtype, 0)
        ref = spec.reference(inputs)
        mx.eval(inputs, ref)
        config = parse_config_key(key)
        fns = {"ours plain": spec.build(config, be.name, shape, args.dtype),
               "ours compiled": be.build(spec, config, shape, args.dtype),
               "built-in": be.build(spec, BUILTIN, shape, args.dtype),
               "built-in compiled": compiled_call(spec.builtin)}
        for name, fn in fns.items():
            if not spec.compare(fn(inputs), ref, args.dtype).ok:
                raise SystemExit(f"{kernel} {shape} {name}: output outside the tolerance")
        med = interleave({n: functools.partial(fn, inputs) for n, fn in fns.items()}, args.rounds)
        label = f"{kernel} {'x'.join(map(str, shape))} {key}"
        lines += _row(label[:46], spec.bytes_moved(shape, args.dtype), med, names)
        print("\n".join(lines[-4:]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
