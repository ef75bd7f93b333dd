"""The host floor of a decode step, and what routing a quantized model's linear layers costs on it.

    python benchmarks/decode_floor.py --config tests/data/models/llama-3-8b.json --dtypes 4bit,bf16
    python benchmarks/decode_floor.py --routes          # each QuantizedLinear routed six ways, 4-bit
    python benchmarks/decode_floor.py --tiny --routes   # CPU: the paths end to end, small

1. Per dtype: mlx-lm's decode loop (``model_timing.decode_s``: the next step queued while the GPU runs
   this one) at batch 1 after ``--context`` tokens, median of ``--rounds`` rounds, for the model
   (``--layers`` decoder layers) and for the same config with hidden 256, intermediate 512, 2 heads,
   1 KV head and a vocabulary of 1,024: the same modules and ops, with kernels too small to matter, so
   its step time is the host's work per step. A model whose step is near that floor is host-bound:
   faster kernels cannot speed it up, fewer or cheaper calls can.
2. ``--routes``: the 4-bit model and its floor config, each ``QuantizedLinear`` at M=1 run six ways, in
   shuffled order round by round: stock; MLX's op on ``x`` reshaped to ``(M, K)``, plain and
   ``mx.compile``d; the kernel's default config as the runtime runs it (``runtime.resolve``: one
   compiled graph) and plain (``spec.build``: the ``mx.fast`` kernel called from Python, GPU only);
   and ``kernelfleet.patch`` with a profile that picks that config at every M=1 shape (gain gate 0).
   Each row: ms a step, and its difference from stock per ``QuantizedLinear`` call.
3. ``--graph`` (instead of 1 and 2): one decode step at batch 1 after ``--context`` tokens of the model at
   each ``--dtypes`` entry, stock and patched (``kernelfleet.patch`` with every call the model's plan
   derives at the kernel's default config, gain gate 0, as ``benchmarks/model.py``'s probe profile): the
   MLX primitives in the step's graph (``mx.export_to_dot`` of the logits before ``mx.eval``, its nodes
   counted by primitive), the calls that build it (``sys.setprofile``'s events: functions written in
   Python, and C functions such as MLX's ops, a compiled graph's replay one of them), and the Python time
   that builds the step (``time.perf_counter`` around the model call, before ``mx.eval``), best of
   ``--steps`` steps in each of ``--rounds`` rounds after an untimed one. On CPU, MLX builds
   ``mx.fast``'s ``rms_norm``, ``rope`` and ``scaled_dot_product_attention`` as their fallbacks (several
   to a dozen primitives each, which compiled graphs then partly fuse) where a GPU builds one primitive:
   so on CPU each side is also counted and timed with those three as one node each (an ``mx.depends`` of
   the output's shape: garbage values, the GPU's graph shape), the ``one node a fast op`` rows (their
   Python calls include the stand-ins' own).

    # 2 layers of the Qwen3-30B-A3B shape on CPU: some 40 minutes on a 2-core host (evaluating the steps)
    python benchmarks/decode_floor.py --config tests/data/models/qwen3-30b-a3b.json --layers 2 --graph \
        --dtypes 4bit --context 16 --steps 8 --rounds 2
    python benchmarks/decode_floor.py --tiny --config tests/data/models/qwen3-30b-a3b.json --graph \
        --dtypes 4bit     # the tiny Qwen3-MoE: the same graphs' structure in seconds
"""

from __future__ import annotations

import argparse
import gc
import io
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import mlx.core as mx
import mlx.nn as nn

import kernelfleet
from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.patch import profile_file, runtime
from kernelfleet.kernels.patch.model_build import TINY, build, load_config, parse_dtype, quantized_config
from kernelfleet.kernels.patch.model_shapes import derive
from kernelfleet.kernels.patch.model_timing import decode_s, primed, without_gc
from kernelfleet.kernels.spec import config_key, format_shape, parse_shape

SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
         "vocab_size": 1024}
KERNEL = "quantized_matmul"


def floor_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with tiny dimensions (MoE experts' own sizes too, where it has them)."""
    small = {**config, **SMALL}
    if "moe_intermediate_size" in config:
        small["moe_intermediate_size"] = 256
    return small


def step_ms(model: nn.Module, args: argparse.Namespace) -> float:
    return 1e3 * without_gc(lambda: decode_s(model, 1, args.context, args.steps))


Undo = Callable[[], None]


def routes(model: nn.Module, dtype: str) -> tuple[dict[str, Callable[[], Undo] | None], int]:
    """The ways to run the model's ``QuantizedLinear`` calls at M=1 (each returns its undo), and how
    many such layers a step calls."""
    spec = get_spec(KERNEL)
    linears = [m for _, m in model.named_modules() if type(m) is nn.QuantizedLinear]
    shape_of = {id(m): (1, int(m.scales.shape[1]) * m.group_size, int(m.weight.shape[0]), m.bits,
                        m.group_size) for m in linears}
    configs = {s: spec.default_config(s, dtype) for s in set(shape_of.values())}
    gpu = runtime.gpu_backend()

    def swap(make: Callable[[tuple[int, ...]], Callable[[Any, mx.array], mx.array]]) -> Undo:
        undo = []
        for m in linears:
            s = shape_of[id(m)]
            one, cls = make(s), type(m)

            def call(self: Any, x: mx.array, one: Any = one, k: int = s[1], own: Any = cls.__call__
                     ) -> mx.array:
                return one(self, x) if x.size == k else own(self, x)  # M=1 routed, the prefill stock
            m.__class__ = type(cls.__name__, (cls,), {"__call__": call})
            undo.append((m, cls))

        def restore() -> None:
            for module, cls in undo:
                module.__class__ = cls
        return restore

    def mlx_op(compiled: bool) -> Callable[[tuple[int, ...]], Any]:
        def make(s: tuple[int, ...]) -> Any:
            _, k, n, bits, group = s

            def op(x: mx.array, w: mx.array, sc: mx.array, b: mx.array) -> mx.array:
                return mx.quantized_matmul(x.reshape(1, k), w, sc, b, transpose=True, group_size=group,
                                           bits=bits).reshape(1, 1, n)
            fn = mx.compile(op) if compiled else op
            return lambda self, x: fn(x, self["weight"], self["scales"], self["biases"])
        return make

    def kernel(compiled: bool) -> Callable[[tuple[int, ...]], Any]:
        def make(s: tuple[int, ...]) -> Any:
            _, k, n, _, _ = s
            r = runtime.resolve(KERNEL, s, dtype, configs[s], {}) if compiled \
                else spec.build(configs[s], gpu or "cuda", s, dtype)
            return lambda self, x: r([x.reshape(1, k), self["weight"], self["scales"],
                                      self["biases"]])[0].reshape(1, 1, n)
        return make

    chip = runtime.target().chip
    profile = {"schema": profile_file.SCHEMA, "chip": chip, "entries": [
        {"kernel": KERNEL, "shape": format_shape(s), "dtype": dtype, "config": c, "config_key": config_key(c),
         "median_us": 10.0, "speedup": 2.0, "predicted": False} for s, c in configs.items()]}

    def patched() -> Undo:
        kernelfleet.patch(model, profile, min_gain_us=0.0)
        return lambda: kernelfleet.unpatch(model)

    out: dict[str, Callable[[], Undo] | None] = {
        "stock": None,
        "MLX's op on (M, K), plain": lambda: swap(mlx_op(False)),
        "MLX's op on (M, K), mx.compile'd": lambda: swap(mlx_op(True)),
        "default config, compiled (runtime.resolve)": lambda: swap(kernel(True)),
        "default config, plain (spec.build)": lambda: swap(kernel(False)),
        "kernelfleet.patch, gain gate 0": patched,
    }
    if gpu is None:  # no mx.fast kernel runs here
        del out["default config, plain (spec.build)"]
    return out, len(linears)


def compare_routes(name: str, model: nn.Module, dtype: str, args: argparse.Namespace) -> None:
    ways, calls = routes(model, dtype)
    times: dict[str, list[float]] = {w: [] for w in ways}
    order = list(ways)
    for r in range(args.rounds + 1):  # round 0 warms every way up
        random.Random(r).shuffle(order)
        for way in order:
            make = ways[way]
            undo = make() if make else None
            try:
                t = step_ms(model, args)
            finally:
                if undo:
                    undo()
            if r:
                times[way].append(t)
    base = statistics.median(times["stock"])
    for way, ts in times.items():
        med = statistics.median(ts)
        print(f"{name} 4bit {way:44} {med:7.3f} ms a step ({med - base:+.3f} ms against stock, "
              f"{(med - base) * 1e3 / calls:+6.2f} us a QuantizedLinear call, {calls} a step; rounds "
              f"{min(ts):.3f}-{max(ts):.3f})", flush=True)


def count_nodes(*outputs: mx.array) -> Counter[str]:
    """The primitives of the unevaluated graph behind ``outputs``, by kind (``mx.export_to_dot``'s nodes)."""
    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return Counter(re.findall(r'label ="([^"]+)", shape=rectangle', dot.getvalue()))


@contextmanager
def one_node_fast_ops() -> Iterator[None]:
    """``mx.fast.rms_norm``, ``rope`` and ``scaled_dot_product_attention`` as one node each, as a GPU builds
    them (``mx.depends`` of the output's shape on the other inputs; the values are not the op's). Graphs
    traced meanwhile (a patched model's, the catalog's compiled add_rmsnorm) hold the stand-ins: patch
    inside, unpatch before leaving."""
    from kernelfleet.kernels.catalog import add_rmsnorm_kernel

    fast = mx.fast
    real = {name: getattr(fast, name) for name in ("rms_norm", "rope", "scaled_dot_product_attention")}

    def node(x: mx.array, *deps: Any) -> mx.array:
        on = [d for d in deps if isinstance(d, mx.array)]
        return mx.depends([x], on or [x])[0]

    stand_ins = {"rms_norm": lambda x, w, eps: node(x, w),
                 "rope": lambda x, *a, offset=0, freqs=None, **k: node(x, offset, freqs),
                 "scaled_dot_product_attention": lambda q, k, v, *a, mask=None, **kw: node(q, k, v, mask)}
    add_rmsnorm_kernel._compiled.cache_clear()
    for name, fn in stand_ins.items():
        setattr(fast, name, fn)
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(fast, name, fn)
        add_rmsnorm_kernel._compiled.cache_clear()


def probe_profile(config: dict[str, Any], dtype: str, quant: Any, context: int) -> dict[str, Any]:
    """Every kernel call the model's plan derives (decode batch 1, a ``context``-token prefill) at the
    kernel's default config: each site the patch matches takes its kernel path."""
    plan = derive(quantized_config(config, dtype, quant) if quant else config, decode=(1,),
                  prefill=(context,), verify=(), dtypes=[dtype])
    entries = [{"kernel": k, "shape": sh, "dtype": dtype,
                "config": get_spec(k).default_config(parse_shape(sh), dtype)}
               for k, shapes in plan.kernel_shapes.items() for sh in shapes]
    return {"schema": profile_file.SCHEMA, "chip": runtime.target().chip, "entries": entries}


def calls_in(fn: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """``fn()``, and the calls it made by ``sys.setprofile`` event: ``call`` (functions written in Python),
    ``c_call`` (C functions: builtins, MLX's ops and compiled graphs)."""
    events: Counter[str] = Counter()

    def hook(frame: Any, event: str, arg: Any) -> None:
        events[event] += 1
    sys.setprofile(hook)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, events


def graph_step(model: nn.Module, args: argparse.Namespace) -> tuple[Counter[str], Counter[str], float]:
    """One decode step's primitives and calls, and the best time to build a step (s), over ``--rounds``
    rounds of ``--steps`` steps after an untimed one (compiled graphs traced, caches warm)."""
    best = float("inf")
    nodes: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    gc.collect()
    gc.disable()  # a collection inside a timed build is not the step's
    for _ in range(args.rounds):
        cache = primed(model, 1, args.context)
        token = mx.zeros((1, 1), mx.int32)
        mx.eval(model(token, cache=cache))
        if not calls:
            y, calls = calls_in(lambda: model(token, cache=cache))  # noqa: B023 (called here)
            mx.eval(y)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            y = model(token, cache=cache)
            best = min(best, time.perf_counter() - t0)
            if not nodes:
                nodes = count_nodes(y)
            mx.eval(y)
    gc.enable()
    return nodes, calls, best


def compare_graphs(label: str, config: dict[str, Any], dtype: str, args: argparse.Namespace) -> None:
    for dt in args.dtypes.split(","):
        quant = parse_dtype(dt)
        model = build(config, dtype, quant)
        profile = probe_profile(config, dtype, quant, args.context)
        passes: list[tuple[str, Callable[[], Any]]] = [("", nullcontext)]
        if runtime.gpu_backend() is None:
            passes.append(("one node a fast op", one_node_fast_ops))
        for name, context in passes:
            for side in ("stock", "patched"):
                with context():
                    if side == "patched":
                        kernelfleet.patch(model, profile, min_gain_us=0.0)
                    try:
                        nodes, calls, build_s = graph_step(model, args)
                    finally:
                        kernelfleet.unpatch(model)
                kinds = ", ".join(f"{k} {n}" for k, n in nodes.most_common())
                print(f"{label} {dt:5} {side:8} {name:18} {sum(nodes.values()):5} primitives a step, built "
                      f"by {calls['call']} Python calls and {calls['c_call']} C calls in "
                      f"{build_s * 1e3:7.3f} ms (best): {kinds}", flush=True)
        del model
        mx.clear_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tests/data/models/llama-3-8b.json")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dtypes", default="4bit,bf16", help="part 1's dtypes (bf16, 4bit, 8bit)")
    p.add_argument("--routes", action="store_true", help="part 2: the QuantizedLinear routes, 4-bit")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny model on CPU: the paths end to end")
    p.add_argument("--graph", action="store_true", help="part 3 only: primitives and build time a step, "
                   "stock and patched")
    args = p.parse_args(argv)
    config = load_config(args.config, args.layers)
    if args.tiny:
        config = dict(TINY[config["model_type"]])
        args.context, args.steps, args.rounds = 8, 4, 1
    dtype = "float32" if args.tiny else "bfloat16"
    print(f"device: {mx.default_device()} ({runtime.target().chip}); mlx {mx.__version__}; decode batch 1 "
          f"after {args.context} tokens, {args.steps} steps a round, median of {args.rounds} rounds",
          flush=True)
    if args.graph:
        compare_graphs(f"{config['model_type']} {config['num_hidden_layers']} layers", config, dtype, args)
        return 0
    models = (("model", config), ("host floor (hidden 256)", floor_config(config)))
    for name, c in models:
        label = f"{config['model_type']} {config['num_hidden_layers']} layers {name:24}"
        for dt in args.dtypes.split(","):
            model = build(c, dtype, parse_dtype(dt))
            ms = [step_ms(model, args) for _ in range(args.rounds)]
            print(f"{label} {dt:5} {statistics.median(ms):7.3f} ms a step "
                  f"(rounds {min(ms):.3f}-{max(ms):.3f})", flush=True)
            del model
            mx.clear_cache()
        if args.routes:
            model = build(c, dtype, parse_dtype("4bit"))
            compare_routes(label, model, dtype, args)
            del model
            mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
