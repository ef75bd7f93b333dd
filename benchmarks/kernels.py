"""Kernel speed: the MLX built-in vs the tuned choice, per catalog kernel and shape, on this GPU.

    python benchmarks/kernels.py --out results/new/kernels.txt --jsonl results/new/tuning.jsonl
    python benchmarks/kernels.py --spread-only --jsonl results/h100_tuning.jsonl   # profile data

For each kernel and each of its decode-size and large shapes it tunes (successive halving; the
built-in is one candidate, so the tuned choice is never slower than the built-in as measured)
and prints the built-in's median, the tuned median, the speedup, and the achieved bandwidth
(``spec.bytes_moved`` / median) against the copy bandwidth measured first on this machine
(a vectorized device-to-device copy kernel). The geometric-mean speedup is over large shapes.

``--spread`` / ``--spread-only`` then tunes every kernel over a grid of shapes (rows x cols for
row-wise kernels) and dtypes until the time limit, appending every tuning report as JSONL.

``--peers``: the table of the frontier instead. Per kernel and large shape, the tuned pick (``--strategy``,
default ``model``: the prior's few best guesses only, see worker/search/model.py), the MLX built-in, torch
eager and torch.compile (default mode, Inductor) where torch has the op (benchmarks/peers.py), all timed
in this process the same way: each round is K queued launches between synchronizations (K from the
tuned pick: a round >= 4 ms), contenders interleaved in a shuffled order per round, median of the rounds.
Each ratio is ours over the contender's time (>1: ours is faster); bandwidth is ``spec.bytes_moved`` over
the median, against the best measured copy (our copy kernel, MLX ``x+0``, torch ``copy_``) and the GPU's
specified peak (H100 SXM 3.35 TB/s, H200 4.8 TB/s). Without torch the peers' columns say so.

Compilation: on CUDA every custom candidate is an NVRTC compile (~1.5 s on the H100 host) the
first time it runs in a process; MLX keeps custom kernels out of its on-disk PTX cache, so a
compile in another process does not help (tried: a 15-process pre-compile changed nothing).
``benchmarks/multi_gpu.sh`` (``session.py``) therefore compiles many kernels in parallel processes
and times them one process at a time.
Imports only mlx, numpy and the kernelfleet kernels/worker packages.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")

import mlx.core as mx  # noqa: E402

from kernelfleet.chips import detect_chip  # noqa: E402
from kernelfleet.kernels.catalog import all_specs, get_spec  # noqa: E402
from kernelfleet.kernels.spec import KernelSpec, Shape, format_shape, parse_config_key  # noqa: E402
from kernelfleet.worker.backends import detect_backend  # noqa: E402
from kernelfleet.worker.measure import Measurer  # noqa: E402
from kernelfleet.worker.report import report_problems  # noqa: E402
from kernelfleet.worker.tuner import TuneOutcome, tune_spec  # noqa: E402

Task = tuple[str, Shape, str]


def _load_sibling(name: str) -> Any:
    """A module of this folder (benchmarks/ is no package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"kf_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

SPREAD_ROWS = (1, 8, 32, 128, 1024, 4096, 16384)
SPREAD_COLS = (1024, 2048, 4096, 8192)

peers: Any = _load_sibling("peers")
bandwidth: Any = _load_sibling("bandwidth")
time_fn = bandwidth.time_fn
copy_kernel = bandwidth.copy_kernel


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


SPEC_PEAK_GBS = {"H100": 3350.0, "H200": 4800.0}  # HBM3 (H100 SXM) and HBM3e (H200), as specified


def spec_peak_gbs(chip_name: str) -> float | None:
    """The specified DRAM bandwidth of the GPU called ``chip_name`` (None when not known here)."""
    return next((v for k, v in SPEC_PEAK_GBS.items() if k in chip_name.upper()), None)


def copy_bandwidth(backend: str, nbytes: int = 1 << 30) -> dict[str, float]:
    """Measured device-to-device copy bandwidth in GB/s (read + write counted): MLX's, and torch's
    copy on CUDA where torch is installed."""
    out = bandwidth.copy_bandwidth(backend, nbytes)
    if backend == "cuda" and (torch_copy := peers.copy_gbs(nbytes)) is not None:
        out["torch_copy"] = torch_copy
        out["limit"] = max(out.values())
    return out


# ----------------------------------------------------------------------------- planning


def rowwise(spec: KernelSpec) -> bool:
    large = list(spec.shapes.get("large", []))
    return bool(large) and len(large[0]) == 2 and spec.shape_doc.lower().startswith("rows")


def valid(spec: KernelSpec, shape: Shape, dtype: str) -> bool:
    try:
        spec.validate_shape(shape)
    except Exception:  # noqa: BLE001 - the spec says no
        return False
    return dtype in spec.dtypes


def main_plan(specs: Sequence[KernelSpec], dtype: str, kinds: Sequence[str] = ("decode", "large"),
              per_kind: int | None = None) -> list[tuple[str, Task]]:
    plan = []
    for spec in specs:
        d = dtype if dtype in spec.dtypes else spec.dtypes[-1]
        for kind in kinds:
            for shape in list(spec.shapes.get(kind, []))[:per_kind]:
                if valid(spec, tuple(shape), d):
                    plan.append((kind, (spec.name, tuple(shape), d)))
    return plan


def spread_plan(specs: Sequence[KernelSpec], dtypes: Sequence[str], seed: int = 0) -> list[Task]:
    """Every kernel over a grid of shapes and dtypes.

    Row-wise kernels get rows x cols; the others their own decode and large shapes. Tasks come in
    groups that share compiled code (kernel, row length, dtype: every row count of one group
    reuses the same kernels), groups in a seeded order round-robin over kernels, so whatever the
    time limit cuts, the data covers all kernels, many row lengths and every row count."""
    per_kernel: list[list[list[Task]]] = []
    for spec in specs:
        groups: list[list[Task]] = []
        if rowwise(spec):
            for c in SPREAD_COLS:
                for d in dtypes:
                    groups.append([(spec.name, (r, c), d) for r in SPREAD_ROWS if valid(spec, (r, c), d)])
        else:
            for d in dtypes:
                groups.append([(spec.name, tuple(s), d) for k in ("decode", "large")
                               for s in spec.shapes.get(k, []) if valid(spec, tuple(s), d)])
        groups = [g for g in groups if g]
        random.Random(f"{seed}-{spec.name}").shuffle(groups)
        per_kernel.append(groups)
    out: list[Task] = []
    for i in range(max((len(g) for g in per_kernel), default=0)):
        for groups in per_kernel:
            if i < len(groups):
                out.extend(groups[i])
    return out


# ----------------------------------------------------------------------------- tuning


def memoize_inputs(spec: KernelSpec, size: int) -> KernelSpec:
    """``spec`` with its (deterministic, seeded) inputs memoized for the last ``size``
    (shape, dtype, seed). Nothing else changes."""
    make = functools.lru_cache(maxsize=size)(lambda shape, dtype, seed: spec.make_inputs(shape, dtype, seed))
    return dataclasses.replace(spec, make_inputs=lambda shape, dtype, seed: make(tuple(shape), dtype, seed))


@functools.cache
def cached_spec(name: str) -> KernelSpec:
    """The catalog spec with its inputs memoized for the last four (shape, dtype, seed):
    generating a 16384x8192 input with numpy takes seconds, and the benchmarks tune the same
    inputs several times."""
    return memoize_inputs(get_spec(name), 4)


def run_tune(task: Task, jsonl: str | None, strategy: str = "halving", seed: int = 0) -> TuneOutcome | None:
    name, shape, dtype = task
    try:
        outcome = tune_spec(cached_spec(name), shape, dtype, strategy=strategy, seed=seed)
    except Exception as e:  # noqa: BLE001 - one failing task must not stop the benchmark
        log(f"  {name} {format_shape(shape)} {dtype}: FAILED {type(e).__name__}: {str(e)[:300]}")
        return None
    problems = report_problems(outcome.report)
    if problems:
        log(f"  {name} {format_shape(shape)} {dtype}: report problems {problems}")
    if jsonl:
        with open(jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(outcome.report, allow_nan=False) + "\n")
    return outcome


REFEREE_ROUNDS = 200


def side_by_side(spec: KernelSpec, shape: Shape, dtype: str, keys: Sequence[str],
                 rounds: int = REFEREE_ROUNDS, seed: int = 0) -> dict[str, float | None]:
    """The medians (µs) of the configs ``keys`` timed side by side: one fresh measurement, the same
    interleaved rounds for all (each config verified against the reference first; None = failed).

    The referee for comparing configs that different tunes picked: two tunes' reported medians also
    differ by the machine's drift between them, and the best of many candidates' medians in one tune
    is biased low (the fastest noise wins)."""
    return side_by_side_measured(spec, shape, dtype, keys, rounds, seed)[1]


def side_by_side_measured(spec: KernelSpec, shape: Shape, dtype: str, keys: Sequence[str],
                          rounds: int = REFEREE_ROUNDS, seed: int = 0,
                          **measurer_kw: Any) -> tuple[Measurer, dict[str, float | None]]:
    """:func:`side_by_side`, also returning its Measurer (each key's trial: status, raw samples,
    launches per round); ``measurer_kw`` go to the Measurer (``check_rounds``, ``resize_rounds``,
    ``min_round_s``)."""
    be = detect_backend()
    keys = list(dict.fromkeys(keys))
    with mx.stream(be.device):
        inputs = spec.make_inputs(shape, dtype, seed)
        reference = spec.reference(inputs)
        mx.eval(inputs, reference)
        measurer = Measurer(spec, be, shape, dtype, inputs, reference, [parse_config_key(k) for k in keys],
                            seed=seed + 1, **measurer_kw)
        return measurer, measurer.measure(keys, rounds)


def side_by_side_gap(spec: KernelSpec, shape: Shape, dtype: str, a: str, b: str) -> float | None:
    """How far apart configs ``a`` and ``b`` are timed side by side: |t_a - t_b| / min(t_a, t_b);
    0 when they are the same config, None when either failed."""
    if a == b:
        return 0.0
    ref = side_by_side(spec, shape, dtype, [a, b])
    ta, tb = ref[a], ref[b]
    return abs(ta - tb) / min(ta, tb) if ta and tb else None


def row_for(kind: str, task: Task, outcome: TuneOutcome, limit_gbs: float) -> dict[str, Any]:
    return row_from_report(outcome.report, limit_gbs, kind) | {"tune_s": outcome.total_s}


def row_from_report(report: dict[str, Any], limit_gbs: float, kind: str | None = None) -> dict[str, Any]:
    """A table row from a tuning report (``kind`` defaults to the spec's shape list it is in)."""
    name, dtype = report["kernel"], report["dtype"]
    shape = tuple(int(d) for d in report["shape"].split("x"))
    spec = get_spec(name)
    if kind is None:
        kind = next((k for k, shapes in spec.shapes.items() if shape in [tuple(s) for s in shapes]), "other")
    trials = {t["config_key"]: t for t in report["trials"]}
    builtin = trials["builtin"]["median_us"]
    best_key = report["best_config_key"]
    tuned = trials[best_key]["median_us"]
    nbytes = spec.bytes_moved(shape, dtype)
    n_ok = sum(t["status"] == "ok" for t in trials.values())
    return {"kernel": name, "kind": kind, "shape": format_shape(shape), "dtype": dtype, "builtin_us": builtin,
            "tuned_us": tuned, "speedup": builtin / tuned if builtin and tuned else None, "best": best_key,
            "builtin_gbs": nbytes / builtin / 1e3 if builtin else None, "tuned_gbs": nbytes / tuned / 1e3,
            "pct_copy": 100 * nbytes / tuned / 1e3 / limit_gbs, "candidates": len(trials), "ok": n_ok}


def fmt_table(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'kernel':<20} {'kind':<6} {'shape':<12} {'dtype':<8} {'builtin µs':>11} {'tuned µs':>10} "
            f"{'speedup':>8} {'builtin GB/s':>12} {'tuned GB/s':>10} {'% copy':>7} {'ok/cand':>8}  best")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['kernel']:<20} {r['kind']:<6} {r['shape']:<12} {r['dtype']:<8} "
                     f"{r['builtin_us']:>11.2f} "
                     f"{r['tuned_us']:>10.2f} {r['speedup']:>7.2f}x {r['builtin_gbs']:>12.0f} "
                     f"{r['tuned_gbs']:>10.0f} {r['pct_copy']:>6.0f}% {r['ok']:>3}/{r['candidates']:<4}  "
                     f"{r['best']}")
    return "\n".join(lines)


def summary(rows: Sequence[dict[str, Any]]) -> str:
    large = [r for r in rows if r["kind"] == "large"]
    if not large:
        return "no large shapes measured"
    gm = math.exp(sum(math.log(r["speedup"]) for r in large) / len(large))
    gm_b = math.exp(sum(math.log(r["builtin_gbs"]) for r in large) / len(large))
    at80 = [r for r in large if r["pct_copy"] >= 80]
    worse = [r for r in rows if r["speedup"] < 1.0]
    return "\n".join([
        f"large shapes: geometric-mean speedup over the built-ins {gm:.2f}x over {len(large)} shapes "
        f"(target >= 1.3x: {'met' if gm >= 1.3 else 'MISSED'})",
        f"large shapes at >= 80% of copy bandwidth: {len(at80)}/{len(large)} "
        f"({', '.join(r['kernel'] + ' ' + r['shape'] for r in at80) or 'none'})",
        f"geometric-mean built-in bandwidth on large shapes: {gm_b:.0f} GB/s",
        f"tuned slower than built-in (as measured): {len(worse)} of {len(rows)}",
    ])


# ----------------------------------------------------------------------------- the frontier (peers)


def peer_row(task: Task, outcome: TuneOutcome, limit_gbs: float, peak_gbs: float | None,
             rounds: int = 25, seed: int = 0) -> dict[str, Any]:
    """The tuned pick, the MLX built-in and the torch peers of ``task``, timed together (module doc)."""
    name, shape, dtype = task
    spec = cached_spec(name)
    be = detect_backend()
    best = outcome.report["best_config_key"]
    with mx.stream(be.device):
        inputs = spec.make_inputs(shape, dtype, seed)
        mx.eval(inputs)
        contenders: dict[str, Callable[[], Any]] = {}
        for label, key in (("ours", best), ("mlx", "builtin")):
            fn = be.build(spec, parse_config_key(key), shape, dtype)
            contenders[label] = functools.partial(fn, inputs)
        torch_fns = peers.peers(name, inputs)
        peer_err: dict[str, float] = {}
        ref = spec.reference(inputs)[0].astype(mx.float32)
        mx.eval(ref)
        for label, fn in torch_fns.items():  # checked against the reference (and compiled) before timing
            got = peers.first_output(fn())
            peer_err[label] = float(abs(got.reshape(-1) - ref.reshape(-1).__array__()).max())
        launch_time = min(t.median() or 1e9 for t in outcome.trials if t.key == best) * 1e-6
        k = peers.launches_for(launch_time)
        times = _interleaved({**{lb: (fn, "mlx") for lb, fn in contenders.items()},
                              **{lb: (fn, "torch") for lb, fn in torch_fns.items()}}, k, rounds, seed)
    peers.release()
    nbytes = spec.bytes_moved(shape, dtype)
    ours = times["ours"]
    row: dict[str, Any] = {"kernel": name, "shape": format_shape(shape), "dtype": dtype, "best": best,
                           "tune_s": outcome.total_s, "launches": k, "rounds": rounds,
                           "candidates": len(outcome.report["trials"]), "peer_max_abs_err": peer_err}
    for label in ("ours", "mlx", "torch eager", "torch.compile"):
        row[f"{label}_us"] = times[label] * 1e6 if label in times else None
    present = [times[lb] for lb in ("mlx", "torch eager", "torch.compile") if lb in times]
    row["vs_best_peer"] = min(present) / ours
    row["gbs"] = nbytes / ours / 1e9
    row["pct_copy"] = 100 * row["gbs"] / limit_gbs
    row["pct_peak"] = 100 * row["gbs"] / peak_gbs if peak_gbs else None
    return row


def _interleaved(fns: dict[str, tuple[Callable[[], Any], str]], k: int, rounds: int,
                 seed: int) -> dict[str, float]:
    """Median seconds per launch of each contender: ``rounds`` rounds, each contender once per round in a
    shuffled order, ``k`` queued launches between synchronizations (one warm-up round first)."""
    def one_round(fn: Callable[[], Any], kind: str) -> float:
        t0 = time.perf_counter()
        if kind == "mlx":
            for _ in range(k):
                mx.async_eval(fn())
            mx.synchronize()
        else:
            for _ in range(k):
                fn()
            peers.torch.cuda.synchronize()
        return (time.perf_counter() - t0) / k

    samples: dict[str, list[float]] = {lb: [] for lb in fns}
    for fn, kind in fns.values():
        one_round(fn, kind)
    order = list(fns)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for lb in order:
            samples[lb].append(one_round(*fns[lb]))
    return {lb: sorted(v)[len(v) // 2] for lb, v in samples.items()}


def fmt_peer_table(rows: Sequence[dict[str, Any]]) -> str:
    def us(v: float | None) -> str:
        return f"{v:>9.1f}" if v is not None else f"{'—':>9}"

    def ratio(r: dict[str, Any], label: str) -> str:
        v = r[f"{label}_us"]
        return f"{v / r['ours_us']:>6.2f}x" if v else f"{'—':>7}"

    head = (f"{'kernel':<20} {'shape':<12} {'ours µs':>9} {'MLX µs':>9} {'eager µs':>9} {'compile µs':>10} "
            f"{'xMLX':>7} {'xEager':>7} {'xCompile':>8} {'xBest':>6} {'GB/s':>6} {'%copy':>6} {'%peak':>6} "
            f"{'tune s':>6}  pick")
    lines = [head, "-" * len(head)]
    for r in rows:
        peak = f"{r['pct_peak']:>5.0f}%" if r["pct_peak"] is not None else f"{'—':>6}"
        lines.append(f"{r['kernel']:<20} {r['shape']:<12} {us(r['ours_us'])} {us(r['mlx_us'])} "
                     f"{us(r['torch eager_us'])} {us(r['torch.compile_us']):>10} {ratio(r, 'mlx')} "
                     f"{ratio(r, 'torch eager')} {ratio(r, 'torch.compile'):>8} {r['vs_best_peer']:>5.2f}x "
                     f"{r['gbs']:>6.0f} {r['pct_copy']:>5.0f}% {peak} {r['tune_s']:>6.1f}  {r['best']}")
    return "\n".join(lines)


def peer_summary(rows: Sequence[dict[str, Any]], torch_note: str) -> str:
    if not rows:
        return "no rows"
    gm = math.exp(sum(math.log(r["mlx_us"] / r["ours_us"]) for r in rows) / len(rows))
    behind = [r for r in rows if r["vs_best_peer"] < 1.0]
    clearly = [r for r in behind if r["vs_best_peer"] < 0.99]
    memory = [r for r in rows if r["kernel"] != "topk_gating_softmax"]
    at90 = [r for r in memory if r["pct_copy"] >= 90]
    tune = sorted(r["tune_s"] for r in rows)
    return "\n".join([
        f"peers: {torch_note}",
        f"geometric-mean speedup over the MLX built-ins: {gm:.2f}x over {len(rows)} rows (target >= 2x)",
        f">= 1.0x against the best peer: {len(rows) - len(behind)}/{len(rows)}; behind: "
        + (", ".join(f"{r['kernel']} {r['shape']} {r['vs_best_peer']:.3f}x" for r in behind) or "none")
        + f"; behind by more than 1%: {len(clearly)}",
        f">= 90% of copy (memory-bound rows, top-k gating excluded): {len(at90)}/{len(memory)}",
        f"tuning time per shape: median {tune[len(tune) // 2]:.1f} s, max {tune[-1]:.1f} s (target <= 10 s)",
    ])


def run_peer_table(specs: Sequence[KernelSpec], args: argparse.Namespace, deadline: float,
                   out_lines: list[str]) -> None:
    chip = detect_chip()
    backend = detect_backend()
    ok, torch_note = peers.available()
    if not ok:
        torch_note += ": torch eager and torch.compile not measured"
    bw = copy_bandwidth(backend.name, 1 << 30)
    peak = spec_peak_gbs(chip.name)
    peak_text = f"{peak:.0f} GB/s" if peak else "unknown for " + chip.name
    lines = ["# copy bandwidth (read + write): " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in bw.items()),
             f"# spec peak: {peak_text}; peers: {torch_note}",
             f"# tuning strategy: {args.strategy}; timing: K launches per sync, {args.rounds} interleaved "
             "rounds, median"]
    print("\n".join(lines), flush=True)
    out_lines += lines
    rows: list[dict[str, Any]] = []
    for _, task in main_plan(specs, args.dtype, ("large",), args.per_kind):
        if time.monotonic() > deadline:
            log("time limit reached; remaining rows skipped")
            break
        log(f"peer row {task[0]} {format_shape(task[1])} {task[2]}")
        outcome = run_tune(task, args.jsonl, strategy=args.strategy)
        if outcome is None:
            continue
        try:
            rows.append(peer_row(task, outcome, bw["limit"], peak, rounds=args.rounds))
        except Exception as e:  # noqa: BLE001 - one failing row must not stop the table
            log(f"  peer row FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        log(f"  {json.dumps(rows[-1])}")
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                table = [fmt_peer_table(rows), "", peer_summary(rows, torch_note)]
                f.write("\n".join(out_lines + table) + "\n")
        if args.rows_jsonl:
            with open(args.rows_jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    print(fmt_peer_table(rows) + "\n\n" + peer_summary(rows, torch_note), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", help="comma-separated subset of the catalog")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", help="write the table here too")
    ap.add_argument("--jsonl", help="append every tuning report here")
    ap.add_argument("--spread", action="store_true", help="after the table, tune the shape grid")
    ap.add_argument("--spread-only", action="store_true")
    ap.add_argument("--kinds", default="decode,large", help="which of each kernel's shape lists to run")
    ap.add_argument("--per-kind", type=int, default=None, help="at most this many shapes of each kind")
    ap.add_argument("--spread-dtypes", default="float16,bfloat16")
    ap.add_argument("--time-limit", type=float, default=480.0,
                    help="start no new tune after this many seconds")
    ap.add_argument("--peers", action="store_true",
                    help="the frontier table: large shapes, ours vs MLX built-in, torch eager, torch.compile")
    ap.add_argument("--strategy", default=None, help="search strategy (default: halving; model with --peers)")
    ap.add_argument("--rounds", type=int, default=25, help="--peers: interleaved timing rounds")
    ap.add_argument("--rows-jsonl", help="--peers: append each row here as JSON")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.time_limit

    chip = detect_chip()
    backend = detect_backend()
    specs = [get_spec(k) for k in args.kernels.split(",")] if args.kernels else all_specs()
    header = (f"# {chip.name} ({chip.arch}), backend {backend.name}, MLX {chip.mlx_version}, {chip.os}, "
              f"driver {chip.driver}\n# kernels: {', '.join(s.name for s in specs)}")
    print(header, flush=True)

    plan = [] if args.spread_only else main_plan(specs, args.dtype, args.kinds.split(","), args.per_kind)
    spread = spread_plan(specs, args.spread_dtypes.split(",")) if (args.spread or args.spread_only) else []

    out_lines = [header]
    if args.peers:
        args.strategy = args.strategy or "model"
        run_peer_table(specs, args, deadline, out_lines)
        return 0
    args.strategy = args.strategy or "halving"
    if plan:
        bw = copy_bandwidth(backend.name, 1 << 30 if backend.supports_custom_kernels else 1 << 26)
        bw_line = "# copy bandwidth (read + write): " + ", ".join(f"{k} {v:.0f} GB/s" for k, v in bw.items())
        print(bw_line, flush=True)
        out_lines.append(bw_line)
        rows = []
        for kind, task in plan:
            if time.monotonic() > deadline:
                log("time limit reached; remaining table rows skipped")
                break
            log(f"tune {task[0]} {format_shape(task[1])} {task[2]} ({kind})")
            outcome = run_tune(task, args.jsonl, strategy=args.strategy)
            if outcome is not None:
                rows.append(row_for(kind, task, outcome, bw["limit"]))
                log(f"  builtin {rows[-1]['builtin_us']:.2f} µs, tuned {rows[-1]['tuned_us']:.2f} µs "
                    f"({rows[-1]['speedup']:.2f}x, {rows[-1]['best']}), {outcome.total_s:.1f}s")
                if args.out:  # rewritten after every row: a killed run still leaves its table
                    with open(args.out, "w", encoding="utf-8") as f:
                        f.write("\n".join(out_lines + [fmt_table(rows), "", summary(rows)]) + "\n")
        print(fmt_table(rows) + "\n\n" + summary(rows), flush=True)

    done = 0
    for task in spread:
        if time.monotonic() > deadline:
            break
        if run_tune(task, args.jsonl) is not None:
            done += 1
    if spread:
        log(f"spread: {done} of {len(spread)} planned tunes written to {args.jsonl}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
