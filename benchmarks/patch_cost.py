"""Where a patched Llama forward's time goes, on the GPU: one fused op timed three ways, the forward
timed with the patch's kernels and with the patch routing the same calls through the built-ins, and
the host time of building one decode step.

    python benchmarks/patch_cost.py --profile benchmarks/results/h100_model_profile.json \\
        --out benchmarks/results/h100_patch_cost.txt     # GPU host; PYTHONPATH as benchmarks/model.py

1. ``add_rmsnorm`` at ``(1, L, hidden)`` bfloat16 for each ``--rows`` L (Llama-3-8B's prefill), per
   launch over 8 rotating input sets (256 MB at L = 2048, past the H100's 50 MB L2), ``--launches``
   launches between evaluations, best of 5 (beside it: the same launches each handed to
   ``mx.async_eval``, and those on one input set, as the tuner times them): as mlx-lm's block runs
   it (``x + r`` then ``mx.fast.rms_norm``, plain ops), the catalog's built-in (the same two under
   ``mx.compile``: what the tuner times as the built-in) and the profile's config through
   :mod:`kernelfleet.kernels.runtime`.
2. Llama (``--layers`` layers, bfloat16) prefill at each ``--prefill`` and decode at each ``--decode``
   batch, in interleaved rounds on one model (``benchmarks/model.py``'s pairing): stock, patched, and
   patched with ``custom_kernels=False`` (the same calls routed through the catalog's built-ins):
   each side against stock, paired by round.
3. Host time to build one decode step's graph (``model(token, cache)``, not evaluated; median of
   32 steps, each evaluated afterwards), stock and patched by turns; ``--cprofile N``: the patched
   step's graph building under cProfile, its N costliest functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kernelfleet.kernels import model_patch, runtime
from kernelfleet.kernels.add_rmsnorm_kernel import EPS, _compiled
from kernelfleet.kernels.profile_view import load

SETS = 8
ROOT = Path(__file__).resolve().parents[1]


def _model_bench() -> Any:
    spec = importlib.util.spec_from_file_location("kf_bench_model", Path(__file__).with_name("model.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_launch_us(fn: Callable[[mx.array, mx.array], Any], sets: list[tuple[mx.array, mx.array]],
                  launches: int, each: bool) -> float:
    """Best of 5: ``launches`` launches cycling through ``sets``, evaluated together (``each`` False)
    or each handed to ``mx.async_eval`` as it is made, as the tuner does (``worker.measure``)."""
    mx.eval(fn(*sets[0]))
    best = float("inf")
    for _ in range(5):
        mx.synchronize()
        t0 = time.perf_counter()
        if each:
            for i in range(launches):
                mx.async_eval(fn(*sets[i % len(sets)]))
            mx.synchronize()
        else:
            mx.eval([fn(*sets[i % len(sets)]) for i in range(launches)])
        best = min(best, (time.perf_counter() - t0) / launches)
    return best * 1e6


def normal(rows: int, d: int) -> mx.array:
    return mx.random.normal((1, rows, d)).astype(mx.bfloat16)


def op_lines(rows: int, d: int, config: dict[str, Any] | None, launches: int) -> list[str]:
    w = mx.ones((d,), mx.bfloat16)
    sets = [(normal(rows, d), normal(rows, d)) for _ in range(SETS)]
    mx.eval(w, sets)
    ways: dict[str, Callable[[mx.array, mx.array], Any]] = {
        "x + r; mx.fast.rms_norm (mlx-lm's block)": lambda x, r: (mx.fast.rms_norm(x + r, w, EPS), x + r),
        "the catalog's built-in (the same, mx.compile'd)": lambda x, r: _compiled(EPS)(x, r, w),
    }
    if config:
        ways[f"custom {config}"] = lambda x, r: runtime.run("add_rmsnorm", [x, r, w], (rows, d), config,
                                                             eps=EPS)
    out = [f"add_rmsnorm (1, {rows}, {d}) bfloat16, µs per launch, best of 5 passes of {launches} launches: "
           f"over {SETS} rotating input sets, evaluated together | the same, each launch async_eval'd | "
           "one input set, each launch async_eval'd (the tuner's way)"]
    base = None
    for label, fn in ways.items():
        us = [per_launch_us(fn, sets, launches, False), per_launch_us(fn, sets, launches, True),
              per_launch_us(fn, sets[:1], launches, True)]
        base = base or us[0]
        out.append(f"  {label:52} {us[0]:8.2f} ({base / us[0]:5.3f}x the first) | {us[1]:8.2f} | "
                   f"{us[2]:8.2f}")
    return out


def decode_host_us(bench: Any, model: nn.Module, batch: int, context: int, steps: int) -> float:
    cache = bench.primed(model, batch, context)
    y = mx.zeros((batch, 1), mx.int32)
    host = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(y, cache=cache)
        host.append(time.perf_counter() - t0)
        y = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)[:, None]
        mx.eval(y)
    return statistics.median(host[1:]) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, help="a KernelFleet profile file for this GPU")
    p.add_argument("--config", default=str(ROOT / "tests/data/models/llama-3-8b.json"),
                   help="an mlx-lm config.json (default: Llama-3-8B's)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers built (default 8)")
    p.add_argument("--rows", type=int, nargs="*", default=[512, 2048],
                   help="add_rmsnorm timed alone at these token counts (none: skip)")
    p.add_argument("--prefill", type=int, nargs="*", default=[2048], help="prefill lengths (none: skip)")
    p.add_argument("--decode", type=int, nargs="+", default=[1], help="decode batch sizes")
    p.add_argument("--context", type=int, default=512, help="tokens in the cache before decode steps")
    p.add_argument("--steps", type=int, default=128, help="decode steps timed per round")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds")
    p.add_argument("--launches", type=int, default=40, help="op launches between evaluations")
    p.add_argument("--cprofile", type=int, default=0, help="profile the patched decode steps' host "
                   "time, printing this many functions")
    p.add_argument("--out", help="also write the report here")
    args = p.parse_args(argv)
    bench = _model_bench()
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    target = runtime.target()
    view = load(args.profile, target.chip)
    emit(f"device: {target.chip} ({target.backend}); mlx {mx.__version__}; profile {args.profile}")
    config = json.loads(Path(args.config).read_text())
    d = int(config["hidden_size"])
    for rows in args.rows:
        for line in op_lines(rows, d, view.choice("add_rmsnorm", (rows, d), "bfloat16"), args.launches):
            emit(line)

    config["num_hidden_layers"] = min(args.layers, int(config["num_hidden_layers"]))
    model = bench.build(config, False, "bfloat16")
    plan = {bench.STOCK: None, bench.PATCHED: lambda m: model_patch.patch(m, args.profile),
            "routed, built-ins": lambda m: model_patch.patch(m, args.profile, custom_kernels=False)}
    emit(f"\nllama ({config['num_hidden_layers']} layers, bfloat16), {args.rounds} interleaved rounds; "
         "each side against stock, paired by round:")
    rows: list[tuple[str, Callable[[nn.Module], float]]] = [
        (f"prefill {n}", lambda m, n=n: bench.prefill_s(m, n)) for n in args.prefill]
    rows += [(f"decode batch {b}", lambda m, b=b: bench.decode_s(m, b, args.context, args.steps))
             for b in args.decode]
    for label, measure in rows:
        times = bench.side_by_side(model, plan, measure, args.rounds)
        stock = times[bench.STOCK]
        emit(f"  {label}: stock {statistics.median(stock) * 1e3:.3f} ms")
        for side in list(plan)[1:]:
            mid, lo, hi = bench.paired_speedup(stock, times[side])
            emit(f"    {side:18} {statistics.median(times[side]) * 1e3:8.3f} ms   "
                 f"{mid:.3f}x [{lo:.3f}, {hi:.3f}] -> {bench.verdict(lo, hi)}")
    for b in args.decode:
        host: dict[str, list[float]] = {bench.STOCK: [], bench.PATCHED: []}
        for r in range(args.rounds):
            for side in (list(host) if r % 2 == 0 else list(host)[::-1]):
                if side == bench.PATCHED:
                    model_patch.patch(model, args.profile)
                try:
                    host[side].append(decode_host_us(bench, model, b, args.context, 32))
                finally:
                    model_patch.unpatch(model)
        emit(f"  decode batch {b}: host time to build one step's graph, median of {args.rounds} rounds: "
             + ", ".join(f"{side} {statistics.median(v):.1f} µs" for side, v in host.items()))
    if args.cprofile:
        for b in args.decode:
            model_patch.patch(model, args.profile)
            try:
                decode_host_us(bench, model, b, args.context, 4)  # decisions made, kernels built
                prof = cProfile.Profile()
                prof.enable()
                decode_host_us(bench, model, b, args.context, 32)
                prof.disable()
            finally:
                model_patch.unpatch(model)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
            emit(f"  decode batch {b}, patched, 32 steps (graph building and evaluation) under cProfile:")
            emit("\n".join("    " + line for line in buf.getvalue().splitlines() if line.strip()))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
