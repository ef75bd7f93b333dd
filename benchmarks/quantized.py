"""Quantized matmul on this GPU: the catalog's ``quantized_matmul`` configs against MLX's own op, MLX's
``dequantize`` + GEMM, the dense GEMM on the same weights, torch's dense GEMM, and the copy bandwidth.

    python benchmarks/quantized.py --out results/new/quantized.txt --rows-jsonl results/new/quantized.jsonl
    python benchmarks/quantized.py --shapes 1x4096x14336x4x64,2048x4096x14336x4x64 --configs default

Shapes are ``M x K x N x bits x group`` (the spec's decode and large lists by default). Per shape:

- the weights come in several copies, together at least ``--min-mb`` (default 256 MB, five times an
  H100's 50 MB L2), and each launch takes the next copy, so every launch reads its weights from DRAM as a
  model's layers do (one copy of a 4096x14336 q4 weight, 33 MB, fits the L2 and would time the cache);
- every contender's output is checked against the float32 reference first (the spec's tolerance); one
  that fails is reported, not timed;
- timing: rounds of K queued launches between synchronizations (a round >= 4 ms), every contender once
  per round in a shuffled order, the median over ``--rounds`` rounds;
- columns: µs per call, bytes moved (``spec.bytes_moved``) per second and its share of the measured copy
  bandwidth (at decode sizes, where the weights' bytes bound the time), TFLOP/s and its share of the dense
  GEMM's (at prefill sizes, where the tensor cores bound it), and MLX's op time over each contender's.

``--configs all`` (default) times every config of the spec's space at the shape (compiled ahead in a pool
of NVRTC processes on CUDA) and prints the best few; ``default`` times the spec's default only.

``--ncu`` (CUDA) gives GPU time instead, which decode sizes need (the host's ~20 µs a launch bounds every
timed row there): every config (``--configs``, ``--paths``) once and MLX's op three times at each shape,
under Nsight Compute with caches flushed (:mod:`ncu`), then the best ``--finalists`` a shape with the DRAM
bytes they read, that rate and its share of the copy bandwidth, and MLX's op beside them:

    python benchmarks/quantized.py --kernel gather_quantized_matmul --shapes 8x2048x768x128x4x64 --ncu
    python benchmarks/quantized.py --ncu --paths qmv_split --where 'rpw=4|8,vw=4' --shapes 1x4096x14336x4x64

Beside them under ncu (quantized_matmul) runs the read floor (:func:`read_floor`, ``floor/x`` in the
table): a kernel that only reads the shape's packed words, scales and biases, timed the same way, so a row
reads against what one launch of exactly those bytes gets from this GPU's DRAM, ramp and drain included
(on the H200 a 33 MB read reaches 77 % of the large-copy figure, a 296 MB one 105 %).

Under ncu each contender launches three times and its first launch is dropped (on the H200 a shape's first
config read hundreds of times its later time); ``--where AXIS=V|V,...`` keeps the configs with those axis
values (a config without an optional axis has it at 0).

Imports only mlx, numpy (torch when present) and the kernelfleet kernels/worker packages.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")

import mlx.core as mx  # noqa: E402

from kernelfleet.chips import detect_chip  # noqa: E402
from kernelfleet.kernels.catalog import (
    affine,  # noqa: E402
    get_spec,  # noqa: E402
)
from kernelfleet.kernels.render.launch import compiled_call  # noqa: E402
from kernelfleet.kernels.spec import (  # noqa: E402
    Config,
    KernelSpec,
    Shape,
    config_key,
    format_shape,
    parse_config_key,
    parse_shape,
)
from kernelfleet.worker.backends.registry import detect_backend, get_backend  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ncu as ncu_tool  # noqa: E402  (the benchmarks' Nsight Compute helpers)

_spec = importlib.util.spec_from_file_location("kf_bench_kernels", Path(__file__).with_name("kernels.py"))
assert _spec and _spec.loader
bench: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # the copy bandwidth the kernel table measures against, and torch's peers
peers: Any = bench.peers

KERNELS = ("quantized_matmul", "gather_quantized_matmul")
Call = Callable[[int], Any]  # copy index -> one launch's output (MLX array or torch tensor)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def copies_for(shape: Shape, dtype: str, min_mb: float) -> int:
    k, n, bits, group = shape[1], math.prod(shape[2:-2]), shape[-2], shape[-1]  # a gather's N x E rows
    return max(1, min(16, math.ceil(min_mb * 1e6 / affine.weight_bytes(n, k, bits, group, dtype))))


def interleaved(calls: dict[str, tuple[Call, str]], copies: int, k: int, rounds: int, seed: int
                ) -> dict[str, float]:
    """Median seconds per launch of each contender (``benchmarks/kernels.py``'s interleaved rounds), each
    launch taking the next weight copy."""
    def cycling(call: Call) -> Callable[[], Any]:
        turn = itertools.count()
        return lambda: call(next(turn) % copies)

    fns = {label: (cycling(call), kind) for label, (call, kind) in calls.items()}
    return dict(bench._interleaved(fns, k, rounds, seed))


Fn = Callable[[list[mx.array]], list[mx.array]]


def peers_of(name: str, shape: Shape) -> tuple[dict[str, Fn], Callable[[list[mx.array]], mx.array]]:
    """MLX's own ways to run the kernel (besides its built-in), and the dense weights of one input set (the
    GEMM on them is the roofline at prefill)."""
    bits, group = shape[-2], shape[-1]
    if name == "quantized_matmul":
        def dq_mm(s: list[mx.array]) -> list[mx.array]:
            return [mx.matmul(s[0], mx.dequantize(s[1], s[2], s[3], group_size=group, bits=bits).T)]

        return {"mlx dequantize+matmul": dq_mm}, lambda s: affine.reference_dequantize(*s[1:4], bits, group)
    t, k, n, e = shape[:4]

    def dq_gather(s: list[mx.array]) -> list[mx.array]:
        w = mx.dequantize(s[1], s[2], s[3], group_size=group, bits=bits)
        return [mx.gather_mm(s[0][:, None, :], w.swapaxes(-1, -2), rhs_indices=s[4])]  # sorted: wrong on CUDA

    def dense(s: list[mx.array]) -> mx.array:
        rows = [a.reshape(e * n, -1) for a in s[1:4]]
        return affine.reference_dequantize(*rows, bits, group).reshape(e, n, k)

    return {"mlx dequantize+gather_mm": dq_gather}, dense


def our_configs(spec: KernelSpec, shape: Shape, dtype: str, backend: str, args: argparse.Namespace
                ) -> list[Config]:
    """The custom configs to run at ``shape``: the backend's whole space (``--configs all``) or the spec's
    default, limited to ``--paths`` and ``--where`` where given."""
    configs: list[Config] = (spec.space_for(shape, dtype, backend) if args.configs == "all"  # type: ignore[arg-type]
                             else [spec.default_config(shape, dtype)])
    paths = set(args.paths.split(",")) if args.paths else None
    where = parse_where(args.where) if args.where else {}
    return [c for c in configs if config_key(c) != "builtin" and (paths is None or c.get("path") in paths)
            and all(str(c.get(axis, 0)) in values for axis, values in where.items())]


def parse_where(text: str) -> dict[str, set[str]]:
    """``--where``: ``AXIS=V|V,AXIS=V`` -> {axis: values}; an axis a config lacks reads 0 (an optional
    axis at its default, e.g. the elementwise kernels' ``hint``)."""
    out: dict[str, set[str]] = {}
    for part in text.split(","):
        axis, sep, values = part.partition("=")
        if not sep or not axis.strip() or not values.strip():
            raise SystemExit(f"--where: {part!r} is not AXIS=V or AXIS=V|V")
        out[axis.strip()] = {v.strip() for v in values.split("|")}
    return out


def check_shapes(spec: KernelSpec, shapes: Sequence[Shape], dtypes: Sequence[str], backend: str,
                 args: argparse.Namespace) -> list[str]:
    """Every config (``--configs``, ``--paths``; ``--sample`` of them per shape, by ``--seed``) checked
    against the float32 reference at each shape and dtype: one line per shape, failures named."""
    import random

    runner = get_backend(backend)
    lines = []
    for shape in shapes:
        for dtype in dtypes:
            configs = our_configs(spec, shape, dtype, backend, args)
            if args.sample and len(configs) > args.sample:
                pick = random.Random(f"{args.seed}-{format_shape(shape)}-{dtype}")
                configs = pick.sample(configs, args.sample)
            if not configs:
                continue
            ahead = runner.precompile(spec, configs, shape, dtype, 0) if backend == "cuda" else None
            if ahead is not None:
                ahead.result()
            inputs = spec.make_inputs(shape, dtype, args.seed)
            ref = spec.reference(inputs)
            mx.eval(inputs, ref)
            bad = []
            worst = 0.0
            for c in configs:
                try:
                    out = runner.build(spec, c, shape, dtype)(inputs)
                    mx.eval(out)
                    cmp = spec.compare(out, ref, dtype)
                except Exception as e:  # reported with the rest
                    bad.append(f"{config_key(c)}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                worst = max(worst, cmp.max_abs_err or 0.0)
                if not cmp.ok:
                    bad.append(f"{config_key(c)}: {cmp.detail}")
            line = (f"{format_shape(shape)} {dtype}: {len(configs) - len(bad)} of {len(configs)} configs "
                    f"match the float32 reference (worst max abs err of those {worst:.3g})")
            lines.append(line + "".join(f"\n  FAILED {b}" for b in bad))
            log(lines[-1])
    return lines


def bench_shape(spec: KernelSpec, shape: Shape, dtype: str, backend: str, args: argparse.Namespace,
                limit_gbs: float) -> list[dict[str, Any]]:
    gather = spec.name == "gather_quantized_matmul"
    m, k, n = shape[:3]
    copies = copies_for(shape, dtype, args.min_mb)
    configs = our_configs(spec, shape, dtype, backend, args)
    runner = get_backend(backend)
    ahead = runner.precompile(spec, configs, shape, dtype, 0) if backend == "cuda" else None
    sets = [spec.make_inputs(shape, dtype, seed) for seed in range(copies)]
    x = sets[0][0]
    for s in sets:
        s[0] = x
        if gather:
            s[4] = sets[0][4]
    mx.eval(sets)
    ref = spec.reference(sets[0])
    mx.eval(ref)
    mlx_peers, dense_of = peers_of(spec.name, shape)
    dense = [dense_of(s).astype(x.dtype) for s in sets]
    mx.eval(dense)
    if ahead is not None:
        log(f"{format_shape(shape)}: {ahead.result()}")

    def mlx_call(fn: Fn) -> Call:
        return lambda i: fn(sets[i])[0]

    builtin_name = "mlx " + ("gather_qmm" if gather else "quantized_matmul")
    fns: dict[str, Fn] = {builtin_name: spec.builtin, **mlx_peers}
    for c in configs:
        fns["ours " + config_key(c)] = compiled_call(spec.build(c, backend, shape, dtype))
    calls: dict[str, tuple[Call, str]] = {}
    failed: dict[str, str] = {}
    for label, fn in fns.items():
        try:
            out = fn(sets[0])
            mx.eval(out)
        except Exception as e:  # a config this GPU cannot run is reported, the rest go on
            failed[label] = f"{type(e).__name__}: {str(e)[:160]}"
            continue
        cmp = spec.compare([out[0].reshape(ref[0].shape)], ref, dtype)
        if not cmp.ok:
            failed[label] = cmp.detail
            continue
        calls[label] = (mlx_call(fn), "mlx")
    if gather:
        idx = sets[0][4]
        calls["mlx dense gather_mm"] = (lambda i: mx.gather_mm(x[:, None, :], dense[i].swapaxes(-1, -2),
                                                                rhs_indices=idx), "mlx")
    else:
        calls["mlx dense matmul"] = (lambda i: mx.matmul(x, dense[i].T), "mlx")
    torch_ok, torch_note = peers.available()
    if torch_ok and not gather:
        tx = peers._to_torch(x)
        tw = [peers._to_torch(d) for d in dense]
        calls["torch dense matmul"] = (lambda i: peers.torch.matmul(tx, tw[i].T), "torch")
    for label, why in failed.items():
        log(f"{format_shape(shape)} {label}: FAILED {why}")
    probe = bench.time_fn(lambda: spec.builtin(sets[0])[0], launches=5, rounds=3)
    k_launches = peers.launches_for(probe)
    # screen every config, then time the finalists with the peers in full rounds
    ours = [lb for lb in calls if lb.startswith("ours ")]
    if len(ours) > args.finalists:
        screen = interleaved({lb: calls[lb] for lb in ours}, copies, k_launches, 3, args.seed)
        keep = set(sorted(ours, key=screen.__getitem__)[:args.finalists])
        calls = {lb: v for lb, v in calls.items() if not lb.startswith("ours ") or lb in keep}
    times = interleaved(calls, copies, k_launches, args.rounds, args.seed)
    nbytes = spec.bytes_moved(shape, dtype)
    flops = 2.0 * m * k * n
    dense_s = times["mlx dense " + ("gather_mm" if gather else "matmul")]
    base = times.get(builtin_name)
    rows = []
    for label, sec in sorted(times.items(), key=lambda t: t[1]):
        rows.append({
            "kernel": spec.name, "shape": format_shape(shape), "dtype": dtype, "contender": label,
            "us": sec * 1e6, "gbs": nbytes / sec / 1e9, "pct_copy": 100 * nbytes / sec / 1e9 / limit_gbs,
            "tflops": flops / sec / 1e12, "pct_dense": 100 * dense_s / sec,
            "vs_mlx": (base / sec) if base else None, "copies": copies, "launches": k_launches,
            "rounds": args.rounds, "torch": torch_note,
        })
    return rows


# The read floor: a kernel that only reads the weights' bytes (packed words, scales, biases) in 16-byte
# loads, a grid of about four loads a thread striding over them, and stores nothing (a word only if the
# bytes' XOR hits a constant, which the compiler cannot rule out): what this GPU's DRAM gives one launch
# of exactly these bytes, timed as the contenders are. % of copy compares with a large copy; the floor is
# the same bytes in one launch, ramp and drain included.
FLOOR_LABEL = "read floor (the weights' bytes)"
FLOOR_SOURCE = """
  const uint4* parts[3] = {reinterpret_cast<const uint4*>(wq), reinterpret_cast<const uint4*>(scales),
                           reinterpret_cast<const uint4*>(biases)};
  const size_t counts[3] = {NW, NS, NS};
  const size_t step = size_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0u;
  for (int p = 0; p < 3; ++p) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < counts[p]; i += step) {
      const uint4 v = parts[p][i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x9E3779B9u) {
    out[0] = acc;
  }
"""
FLOOR_THREADS = 256
FLOOR_LOADS = 4  # 16-byte loads a thread


def floor_fits(inputs: Sequence[mx.array]) -> bool:
    """Whether the read floor can read these inputs' packed words, scales and biases: each whole 16-byte
    words (a small shape's scales may not be)."""
    wq, sc, bi = inputs[1:4]
    return not (wq.nbytes % 16 or sc.nbytes % 16 or bi.nbytes != sc.nbytes)


@functools.cache
def _floor_kernel() -> Any:
    """The read floor's ``mx.fast`` kernel object, made once (MLX compiles it at its first launch)."""
    return mx.fast.cuda_kernel(name="kf_read_floor", input_names=["wq", "scales", "biases"],
                               output_names=["out"], source=FLOOR_SOURCE)


def read_floor(inputs: Sequence[mx.array]) -> mx.array:
    """The read floor's launch over one input set's packed words, scales and biases (:func:`floor_fits`)."""
    wq, sc, bi = inputs[1:4]
    if not floor_fits(inputs):
        raise ValueError("read floor: the weights' parts are not whole 16-byte words")
    words = (wq.nbytes + 2 * sc.nbytes) // 16
    blocks = max(1, math.ceil(words / (FLOOR_THREADS * FLOOR_LOADS)))
    return _floor_kernel()(inputs=[wq, sc, bi], template=[("NW", wq.nbytes // 16), ("NS", sc.nbytes // 16)],
                  grid=(blocks * FLOOR_THREADS, 1, 1), threadgroup=(FLOOR_THREADS, 1, 1),
                  output_shapes=[(1,)], output_dtypes=[mx.uint32])[0]


NCU_LINE = "NCU "  # the child's label of the contender its next kernels belong to
# launches a contender under ncu; the first is dropped: on the H200 each shape's first config, launched once,
# read 1,256-9,681 us, hundreds of times its later time, with a tenth of the DRAM bytes
NCU_LAUNCHES = 3


def ncu_child(spec: KernelSpec, shapes: Sequence[Shape], dtype: str, backend: str, args: argparse.Namespace
              ) -> None:
    """Under ncu: per shape its inputs, then each config and MLX's op ``NCU_LAUNCHES`` times each, a marker
    kernel after each launch (``ncu.MARKER``) and a label line before, so the parent can tell whose
    kernels are whose."""
    runner = get_backend(backend)
    marker_input = mx.zeros((256,), dtype=mx.int32)
    mx.eval(marker_input)

    def run(label: str, shape: Shape, work: Callable[..., Any], *work_args: Any) -> Any:
        print(f"{NCU_LINE}{format_shape(shape)} {label}", flush=True)
        out = work(*work_args)
        mx.eval(out)
        mx.synchronize()
        mx.eval(mx.cumsum(marker_input))
        mx.synchronize()
        return out

    mx.eval(mx.cumsum(marker_input))  # opens the first group
    for shape in shapes:
        inputs = run("inputs", shape, spec.make_inputs, shape, dtype, args.seed)
        for c in our_configs(spec, shape, dtype, backend, args):
            fn = runner.build(spec, c, shape, dtype)
            for _ in range(NCU_LAUNCHES):
                run(config_key(c), shape, fn, inputs)
        for _ in range(NCU_LAUNCHES):
            run("builtin", shape, spec.builtin, inputs)
        if spec.name == "quantized_matmul" and floor_fits(inputs):
            for _ in range(NCU_LAUNCHES):
                run("floor", shape, read_floor, inputs)


def ncu_tables(spec: KernelSpec, shapes: Sequence[Shape], dtype: str, backend: str, args: argparse.Namespace,
               limit_gbs: float) -> str:
    """Run :func:`ncu_child` under ncu (the configs compiled ahead first) and tabulate its GPU times."""
    tool = ncu_tool.find()
    if tool is None:
        raise SystemExit("--ncu: no ncu on PATH or in /usr/local/cuda/bin (Nsight Compute)")
    runner = get_backend(backend)
    for shape in shapes:
        ahead = runner.precompile(spec, our_configs(spec, shape, dtype, backend, args), shape, dtype, 0)
        if ahead is not None:
            log(f"{format_shape(shape)}: {ahead.result()}")
    program = [sys.executable, str(Path(__file__).resolve()), "--ncu-child", "--kernel", spec.name,
               "--shapes", ",".join(format_shape(s) for s in shapes), "--dtype", dtype, "--configs",
               args.configs, "--seed", str(args.seed), *(["--paths", args.paths] if args.paths else []),
               *(["--where", args.where] if args.where else [])]
    done = subprocess.run(ncu_tool.command(tool, program), capture_output=True, text=True, check=False)
    labels = [line[len(NCU_LINE):].split(" ", 1) for line in done.stdout.splitlines()
              if line.startswith(NCU_LINE)]
    found = ncu_tool.groups(ncu_tool.parse(done.stdout))
    if done.returncode != 0 or len(found) != len(labels):
        raise SystemExit(f"--ncu: ncu exited {done.returncode}, {len(found)} kernel groups for {len(labels)} "
                         f"contenders\n{done.stderr[-2000:]}")
    by_shape: dict[str, dict[str, list[list[ncu_tool.Kernel]]]] = {}
    for (shape_s, label), kernels in zip(labels, found, strict=True):
        by_shape.setdefault(shape_s, {}).setdefault(label, []).append(kernels)
    head = (f"{'shape':24} {'contender':40} {'GPU µs':>8} {'DRAM MB':>8} {'GB/s':>6} {'%copy':>6} "
            f"{'mlx/x':>6} {'floor/x':>7}  grid / kernels")
    out = [f"{spec.name} on {detect_chip().name} ({backend}), MLX {mx.__version__}, {dtype}: GPU time under "
           f"Nsight Compute (caches flushed, the GPU's own clocks); copy limit {limit_gbs:.0f} GB/s", head,
           "-" * len(head)]
    for shape_s, runs in by_shape.items():
        runs.pop("inputs", None)
        out += ncu_rows(spec.name, shape_s, runs, args.finalists, limit_gbs)
    return "\n".join(out)


def ncu_rows(kernel: str, shape_s: str, runs: dict[str, list[list[ncu_tool.Kernel]]], finalists: int,
             limit_gbs: float) -> list[str]:
    """One shape's lines of the ncu table: each contender's median launch (its kernels' GPU time and DRAM
    bytes summed), the best ``finalists`` configs with MLX's op and the read floor beside them, fastest
    first, each with MLX's op time over its own (``mlx/x``) and the floor's over its own (``floor/x``)."""
    rows = []
    for label, launches in runs.items():
        kernels = ncu_tool.median_launch(launches)
        us, mb = sum(k.us for k in kernels), sum(k.mb for k in kernels)
        mine = [k for k in kernels if ncu_tool.ours(k.name)]
        if label == "builtin":
            label, where = "mlx " + kernel + " (built-in)", ", ".join(k.name[:40] for k in kernels)
        elif label == "floor":
            label, where = FLOOR_LABEL, f"grid {kernels[0].grid}" if kernels else ""
        else:
            where = f"grid {mine[0].grid}" if mine else ", ".join(k.name[:30] for k in kernels)
        rows.append((us, mb, label, where))
    peer = [r for r in rows if r[2].startswith("mlx ") or r[2] == FLOOR_LABEL]
    mlx_us = next((r[0] for r in peer if r[2].startswith("mlx ")), None)
    floor_us = next((r[0] for r in peer if r[2] == FLOOR_LABEL), None)
    best = sorted(r for r in rows if r not in peer)[:finalists]
    out = []
    for us, mb, label, where in sorted(best + peer):
        gbs = mb / us * 1e3 if us else 0.0
        vs = f"{mlx_us / us:.2f}x" if mlx_us and us else "-"
        fl = f"{floor_us / us:.2f}x" if floor_us and us else "-"
        pct = 100 * gbs / limit_gbs
        out.append(f"{shape_s:24} {label[:40]:40} {us:8.2f} {mb:8.2f} {gbs:6.0f} {pct:5.0f}% {vs:>6} "
                   f"{fl:>7}  {where}")
    return out


def fmt(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'shape':24} {'contender':36} {'µs':>9} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8} {'%dense':>7} "
            f"{'mlx/x':>6}")
    out = [head, "-" * len(head)]
    for r in rows:
        vs = f"{r['vs_mlx']:.2f}x" if r["vs_mlx"] else "-"
        out.append(f"{r['shape']:24} {r['contender'][:36]:36} {r['us']:9.1f} {r['gbs']:7.0f} "
                   f"{r['pct_copy']:5.0f}% {r['tflops']:8.1f} {r['pct_dense']:6.0f}% {vs:>6}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", choices=KERNELS, default=KERNELS[0])
    ap.add_argument("--shapes", help="comma-separated shapes of --kernel, e.g. MxKxNxBITSxGROUP for "
                    "quantized_matmul (default: the spec's decode + large)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--configs", choices=("all", "default"), default="all")
    ap.add_argument("--paths", help="only configs of these paths (comma-separated, e.g. mma,qmv)")
    ap.add_argument("--where", metavar="AXIS=V|V,...",
                    help="only configs with these axis values (e.g. rpw=4|8,pf=0|1; a config without an "
                         "optional axis has it at 0)")
    ap.add_argument("--check", action="store_true", help="check configs against the reference, time nothing")
    ap.add_argument("--check-dtypes", default="bfloat16,float16", help="dtypes --check covers")
    ap.add_argument("--sample", type=int, default=0,
                    help="--check: at most this many configs a shape (0: all)")
    ap.add_argument("--profile", metavar="CONFIGS",
                    help="run these configs (keys, e.g. from a table, separated by ';'), each beside MLX's "
                         "op, 3 times each at --shapes, in the order given, timing nothing: for Nsight "
                         "Compute (ncu), which gives each kernel's GPU time")
    ap.add_argument("--ncu", action="store_true",
                    help="CUDA: GPU time per launch under Nsight Compute, every config once (--configs, "
                         "--paths) and MLX's op, caches flushed, instead of timed rounds: the best "
                         "--finalists a shape")
    ap.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)  # what --ncu runs under ncu
    ap.add_argument("--finalists", type=int, default=4,
                    help="configs timed in full rounds beside the peers (--ncu: configs shown a shape)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-mb", type=float, default=256.0, help="weight copies per shape add up to this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the table here too")
    ap.add_argument("--rows-jsonl", help="append each row here as JSON")
    args = ap.parse_args(argv)
    spec = get_spec(args.kernel)
    backend = detect_backend().name
    chip = detect_chip()
    if backend not in ("cuda", "metal"):
        print(f"no GPU backend here ({backend}): this benchmark needs CUDA or Metal", file=sys.stderr)
        return 2
    shapes = ([parse_shape(s) for s in args.shapes.split(",")] if args.shapes
              else [*spec.shapes["decode"], *spec.shapes["large"]])
    for shape in shapes:
        spec.validate_shape(shape)
    if args.ncu_child:
        ncu_child(spec, shapes, args.dtype, backend, args)
        return 0
    if args.ncu:
        if backend != "cuda":
            print("--ncu needs the CUDA backend (Nsight Compute)", file=sys.stderr)
            return 2
        text = ncu_tables(spec, shapes, args.dtype, backend, args, bench.copy_bandwidth(backend)["limit"])
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 0
    if args.profile:
        runner = get_backend(backend)
        for shape in shapes:
            inputs = spec.make_inputs(shape, args.dtype, args.seed)
            mx.eval(inputs)
            for key in args.profile.split(";"):
                ours = runner.build(spec, parse_config_key(key), shape, args.dtype)
                for _ in range(3):
                    mx.eval(ours(inputs))
                    mx.eval(spec.builtin(inputs))
                    mx.synchronize()
                log(f"profiled {spec.name} {format_shape(shape)}: ours {key} and MLX's op, 3 times each")
        return 0
    if args.check:
        lines = check_shapes(spec, shapes, args.check_dtypes.split(","), backend, args)
        head = f"{spec.name} on {chip.name} ({backend}), MLX {mx.__version__}: configs checked"
        text = "\n".join([head, *lines])
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return 1 if "FAILED" in text else 0
    bw = bench.copy_bandwidth(backend)
    limit = bw["limit"]
    title = (f"{spec.name} on {chip.name} ({backend}), MLX {mx.__version__}, {args.dtype}; copy limit "
             f"{limit:.0f} GB/s ({', '.join(f'{k} {v:.0f}' for k, v in bw.items() if k != 'limit')})")
    log(title)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        t0 = time.perf_counter()
        got = bench_shape(spec, shape, args.dtype, backend, args, limit)
        rows += got
        log(f"{format_shape(shape)} done in {time.perf_counter() - t0:.0f} s\n{fmt(got)}")
        if args.rows_jsonl:
            with open(args.rows_jsonl, "a") as f:
                for r in got:
                    f.write(json.dumps({"chip": chip.name, "mlx": mx.__version__, **r}) + "\n")
        peers.release()
    text = title + "\n" + fmt(rows)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
