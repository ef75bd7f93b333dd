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
   :mod:`kernelfleet.kernels.patch.runtime`.
2. Llama (``--layers`` layers, bfloat16) prefill at each ``--prefill`` and decode at each ``--decode``
   batch, in interleaved rounds on one model (``benchmarks/model.py``'s pairing): stock, patched, and
   patched with ``custom_kernels=False`` (the same calls routed through the catalog's built-ins):
   each side against stock, paired by round.
3. Host time to build one decode step's graph (``model(token, cache)``, not evaluated; median of
   32 steps, each evaluated afterwards), stock and patched by turns; ``--cprofile N``: the patched
   step's graph building under cProfile, its N costliest functions by own time.

``--quantized BITS`` measures a quantized model's patched ``QuantizedLinear`` instead (``--profile``
optional: without one, every planned ``quantized_matmul`` shape at the kernel's default config)::

    python benchmarks/patch_cost.py --quantized 4 --decode 1 8 --out benchmarks/results/h100_patch_cost_q4.txt

4. One ``QuantizedLinear`` of the model (q_proj, ``--group``) at ``x`` of ``(batch, 1, hidden)``: the
   host time of one call (graph building only, ``--launches`` calls between evaluations, interleaved
   rounds, the order rotating): MLX's layer as it is, the raw kernel call (the runner
   ``runtime.resolve`` gives for the profile's config, on ``x`` already ``(M, K)``), the patched layer
   on its kernel path, and, at 3 tokens a sequence (no profile entry), MLX's layer and the patched
   layer running its own code.
5. The quantized model's decode step (section 3's host time), in rotating order: stock; ``raw kernel
   calls``, every ``QuantizedLinear`` with a profile config at M = batch calling that runner itself
   (``x`` reshaped to ``(M, K)``, the runner, reshaped back: no dispatch, counts or checks); and
   patched. Per patched quantized call: patched over stock, patched over the raw kernel calls (the
   issue's target, patched <= raw + 3 µs, measured where it is paid) and the raw calls over stock.

On CPU custom kernels do not run; ``--emulate-gpu`` gives the custom path the GPU's structure there
(the runner is one ``mx.compile``d graph of the built-in, as ``runtime.resolve`` builds one of the
kernel), so the host cost of the patch's own work is measured on any machine.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kernelfleet.kernels.catalog.add_rmsnorm_kernel import EPS, _compiled
from kernelfleet.kernels.patch import model_decode, model_patch, runtime
from kernelfleet.kernels.patch.profile_view import load
from kernelfleet.kernels.render.launch import compiled_call
from kernelfleet.kernels.spec import BUILTIN

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


def decode_host_us(bench: Any, model: nn.Module, batch: int, context: int, steps: int,
                   swap: Callable[[], Callable[[], None]] | None = None) -> float:
    """Median host µs to build one decode step's graph; ``swap``: applied after the prefill (it
    returns its undo)."""
    cache = bench.primed(model, batch, context)
    undo = swap() if swap else None
    y = mx.zeros((batch, 1), mx.int32)
    host = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            logits = model(y, cache=cache)
            host.append(time.perf_counter() - t0)
            y = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)[:, None]
            mx.eval(y)
    finally:
        if undo:
            undo()
    return statistics.median(host[1:]) * 1e6


def raw_kernel_calls(model: nn.Module, view: Any, batch: int, dtype: str, swapped: list[int]
                     ) -> Callable[[], None]:
    """Every ``QuantizedLinear`` of ``model`` whose ``quantized_matmul`` at M = ``batch`` has a custom
    config in ``view`` calls that config's runner directly on ``x`` of ``(batch, 1, K)``: reshaped to
    ``(M, K)``, the raw kernel call, reshaped back (plus the bias where the layer has one), with no
    dispatch, counting or check: the least host work a routed decode call can do. Returns the undo;
    ``swapped`` gets the number of layers changed."""
    undo = []
    for _, m in model.named_modules():
        if type(m) is not nn.QuantizedLinear:
            continue
        k, n = int(m.scales.shape[1]) * m.group_size, int(m.weight.shape[0])
        shape = (batch, k, n, m.bits, m.group_size)
        config = view.choice("quantized_matmul", shape, dtype)
        if config is None:
            continue
        runner = runtime.resolve("quantized_matmul", shape, dtype, config, {})

        def call(self: Any, x: mx.array, r: Any = runner, k: int = k, n: int = n) -> mx.array:
            y: mx.array = r([x.reshape(batch, k), self["weight"], self["scales"], self["biases"]])[0]
            return y.reshape(batch, 1, n) + self["bias"] if "bias" in self else y.reshape(batch, 1, n)
        cls = type(m)
        m.__class__ = type(cls.__name__, (cls,), {"__call__": call})
        undo.append((m, cls))
    swapped.append(len(undo))

    def restore() -> None:
        for module, cls in undo:
            module.__class__ = cls
    return restore


def call_us(fns: dict[str, Callable[[], Any]], launches: int, rounds: int) -> dict[str, list[float]]:
    """Host µs a call of each of ``fns``: per round, ``launches`` calls building their graphs (timed),
    then one evaluation of all (untimed); the order of ``fns`` rotates round by round."""
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds + 1):  # round 0 warms up
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[name]
            t0 = time.perf_counter()
            outs = [fn() for _ in range(launches)]
            t = time.perf_counter() - t0
            mx.eval(outs)
            if r:
                out[name].append(t / launches * 1e6)
    return out


def emulate_gpu() -> None:
    """The GPU's custom path on CPU: a custom config resolves to one ``mx.compile``d graph of the
    kernel's built-in (what ``runtime.resolve`` builds of the kernel on a GPU), and the patch routes
    as where custom kernels run, but for the layer blocks' own decode attention (``model_decode``: a
    kernel that reads its length at run time has no built-in to stand in for it), which is left out."""
    real = runtime.resolve

    def resolve(name: str, shape: Any, dtype: str, config: dict[str, Any], params: dict[str, Any]) -> Any:
        if config == BUILTIN:
            return real(name, shape, dtype, config, params)
        builtin = runtime._module(name).builtin
        return compiled_call(lambda inputs: list(builtin(inputs, **params)))
    runtime.resolve = resolve  # type: ignore[assignment]
    runtime.gpu_backend = lambda: "cuda"  # type: ignore[assignment]
    model_decode.BACKENDS = ()


def quantized_lines(args: argparse.Namespace, bench: Any, config: dict[str, Any]) -> Iterator[str]:
    bits, group, dtype = args.quantized, args.group, args.dtype
    config["num_hidden_layers"] = min(args.layers, int(config["num_hidden_layers"]))
    keys = bench.plan_keys(config, argparse.Namespace(decode=args.decode, prefill=args.prefill, dtype=dtype),
                           (bits, group))
    profile: Any = args.profile or bench.probe_profile([k for k in keys if k[0] == "quantized_matmul"])
    view = load(profile, runtime.target().chip)
    model = bench.build(config, dtype, (bits, group))
    layer = model.model.layers[0].self_attn.q_proj
    k, n = int(layer.scales.shape[1]) * group, int(layer.weight.shape[0])
    yield (f"\nquantized linear {k} -> {n}, {bits}-bit group {group}, {dtype}: host µs a call, "
           f"{args.launches} calls a round, {args.rounds} rounds (median, min)"
           + (" [--emulate-gpu]" if args.emulate_gpu else ""))
    for b in args.decode:
        x, other = (mx.random.normal((b, t, k)).astype(getattr(mx, dtype)) for t in (1, 3))
        shape = (b, k, n, bits, group)
        config_ = view.choice("quantized_matmul", shape, dtype)
        if config_ is None:
            yield f"  batch {b}: the profile has no custom quantized_matmul at {shape}: skipped"
            continue
        runner = runtime.resolve("quantized_matmul", shape, dtype, config_, {})
        inputs = [x.reshape(b, k), layer["weight"], layer["scales"], layer["biases"]]
        mx.eval(x, other, inputs)
        fns: dict[str, Callable[[], Any]] = {"MLX's QuantizedLinear": lambda x=x: layer(x),
                                             "raw kernel call": lambda r=runner, i=inputs: r(i),
                                             "MLX's at M=3b": lambda o=other: layer(o)}
        model_patch.patch(model, profile)
        try:
            fns["patched, kernel path"] = lambda x=x: layer(x)
            fns["patched, its own code (M=3b)"] = lambda o=other: layer(o)
            times = call_us(fns, args.launches, args.rounds)
        finally:
            model_patch.unpatch(model)
        mlx, raw, mlx3, patched, own = (statistics.median(v) for v in times.values())
        yield (f"  batch {b} ({config_}): " + "; ".join(
            f"{name} {statistics.median(v):.2f} ({min(v):.2f})" for name, v in times.items()))
        yield (f"    patched - raw kernel call {patched - raw:+.2f} µs; patched - MLX's {patched - mlx:+.2f} "
               f"µs; its own code through the patch - MLX's at M=3b {own - mlx3:+.2f} µs")
    raw_side = "raw kernel calls"
    for b in args.decode:
        host: dict[str, list[float]] = {bench.STOCK: [], raw_side: [], bench.PATCHED: []}
        report, swapped = None, []

        def raw_swap(b: int = b, swapped: list[int] = swapped) -> Callable[[], None]:
            return raw_kernel_calls(model, view, b, dtype, swapped)
        for r in range(args.rounds):
            names = list(host)
            for side in names[r % 3:] + names[:r % 3]:  # the order rotates round by round
                swap = raw_swap if side == raw_side else None
                if side == bench.PATCHED:
                    report = model_patch.patch(model, profile)
                try:
                    host[side].append(decode_host_us(bench, model, b, args.context, 32, swap))
                finally:
                    model_patch.unpatch(model)
        assert report is not None
        # the projections the patch routes: one a quantized linear layer, three a gated MLP block or an
        # attention block's joined q/k/v, seven a decoder layer block
        calls = max(sum({"quantized linear": 1, "quantized gated MLP": 3,
                         "quantized attention projections": 3, "quantized decoder layer": 7}.get(m.kind, 0)
                        for m in report.patched), 1)
        stock, raw, patched = (statistics.median(v) for v in host.values())
        yield (f"  decode batch {b}, {config['num_hidden_layers']} layers: host µs to build one step, median "
               f"of {args.rounds} rounds: stock {stock:.1f}, raw kernel calls {raw:.1f} ({swapped[-1]} a "
               f"step), patched {patched:.1f}: {(patched - stock) / calls:+.2f} µs a patched quantized call "
               f"({calls} a step)")
        yield (f"    per quantized call: patched - raw kernel call {(patched - raw) / calls:+.2f} µs (the "
               f"issue's target: <= 3); raw kernel call - MLX's {(raw - stock) / calls:+.2f} µs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", help="a KernelFleet profile file for this GPU (optional with --quantized)")
    p.add_argument("--quantized", type=int, choices=(4, 8), help="time a quantized model's patched "
                   "QuantizedLinear (sections 4-5) instead of sections 1-3")
    p.add_argument("--group", type=int, default=64, choices=(32, 64, 128), help="--quantized: group size")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="--quantized: the model's dtype (float32 on CPU, where MLX's bf16 math is slow)")
    p.add_argument("--emulate-gpu", action="store_true", help="on CPU: the custom path's GPU structure "
                   "(a compiled graph of the built-in)")
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
    if not args.profile and not args.quantized:
        p.error("give --profile (or --quantized BITS)")
    if args.emulate_gpu:
        emulate_gpu()
    bench = _model_bench()
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    target = runtime.target()
    emit(f"device: {target.chip} ({target.backend}); mlx {mx.__version__}; profile {args.profile}")
    config = json.loads(Path(args.config).read_text())
    if args.quantized:
        for line in quantized_lines(args, bench, config):
            emit(line)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")
        return 0
    view = load(args.profile, target.chip)
    d = int(config["hidden_size"])
    for rows in args.rows:
        for line in op_lines(rows, d, view.choice("add_rmsnorm", (rows, d), "bfloat16"), args.launches):
            emit(line)

    config["num_hidden_layers"] = min(args.layers, int(config["num_hidden_layers"]))
    model = bench.build(config, "bfloat16")
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
