"""Tuning time per large shape, with and without compiling the candidates ahead (issue 16).

    # on the GPU host, after `source .mlxcuda/b/setup.sh`, kernels/ and worker/ copied to
    # /tmp/kf/kernelfleet and PYTHONPATH=/tmp/kf:$PYTHONPATH (as benchmarks/frontier.sh does):
    python3 -P benchmarks/tune_time.py run --out $OUT/tune_time.txt [--rows rmsnorm:16384x8192,...]
    python3 -P benchmarks/tune_time.py parts rmsnorm 16384x8192     # where one tune's time goes

For every row, three fresh processes tune the shape with the ``model`` strategy (the worker's
default for large shapes: the cost model's 6 candidates and the built-in): **before**, every custom
candidate compiled by MLX at its first launch, one after another
(``KERNELFLEET_CUDA_PRECOMPILE=0``); **after**, the tuner's CUDA backend compiling them ahead, all
at once in a pool of processes, into MLX's PTX cache (:mod:`kernelfleet.kernels.render.cuda_precompile`)
while numpy makes the inputs, the pool starting in the tune; **started**, the same with the pool
already running, as in a worker that has tuned before (the warm-up compiles the same candidates for
float16: other sources, so nothing the timed tune needs is cached). They run in turn (which goes
first rotates by row), after an untimed warm-up in the same process (the row's inputs, its built-in
and one verification against the reference: a long-running worker has its CUDA context and MLX's own
kernels already). All processes share one MLX cache directory, as a worker's tunes do, so MLX's own
kernels (the built-ins, the fused verification kernel: 25 s to compile the first time on an H100
host) come from disk after the first; every custom kernel is deleted from it after each process, so
no tune finds another's. ``tune s`` is the whole ``tune_spec`` call: inputs, reference, compiles,
measurement, golden output.

Then one more process times side by side (``kernels.side_by_side``, 200 interleaved rounds) the
three picks and, where ``--exhaustive`` names one for this row, the exhaustive search's best: the
pick's gap to exhaustive's best.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
DTYPE = "bfloat16"
DEFAULT_ROWS = ("rmsnorm:16384x8192", "add_rmsnorm:16384x8192", "layernorm:16384x8192",
                "softmax:16384x8192", "swiglu:16384x8192", "moe_combine:16384x2x4096")
WARM_DTYPE = "float16"
POOL_STARTED_ENV = "KF_TUNE_TIME_POOL_STARTED"
MODES = ("before", "after", "started")  # started: "after" with the compile pool already running
TARGET_S = 10.0
GAP = 0.03


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child_row(kernel: str, shape: str) -> dict[str, Any]:
    """One tune in this (fresh) process, after the warm-up; precompiling per the environment."""
    import mlx.core as mx

    from kernelfleet.worker.tuner import get_spec, resolve, tune_spec

    spec = get_spec(kernel)
    dims = resolve(spec, shape, DTYPE)
    t0 = time.perf_counter()
    warm = spec.make_inputs(dims, DTYPE, 1)
    spec.compare(spec.builtin(warm), spec.reference(warm), DTYPE)
    del warm
    pool = None
    if os.environ.get(POOL_STARTED_ENV) == "1":  # a worker that has tuned before: its pool is up
        pool = _start_pool(spec, shape)
    warm_s = time.perf_counter() - t0
    outcome = tune_spec(spec, shape, DTYPE, strategy="model", backend="cuda")
    return {"kernel": kernel, "shape": shape, "pick": outcome.report["best_config_key"],
            "tune_s": outcome.total_s, "prepare_s": outcome.prepare_s, "measure_s": outcome.measure_s,
            "precompiled": outcome.precompiled, "warm_s": warm_s, "pool_started": pool,
            "measured": len(outcome.trials), "device": mx.device_info().get("device_name")}


def _model_order(be: Any, spec: Any, dims: Any, dtype: str) -> list[Any]:
    """The CUDA candidates in the model strategy's order (the built-in first, then its cost model's)."""
    from kernelfleet.worker.search.model import prior_order

    return prior_order(spec, dims, dtype, be.candidates(spec, dims, dtype))


def _start_pool(spec: Any, shape: str) -> str | None:
    """Start the compile pool as an earlier tune would have: compile the model strategy's candidates
    for float16 (another source, so nothing the timed bfloat16 tune needs is cached)."""
    from kernelfleet.worker.backends.registry import get_backend
    from kernelfleet.worker.search.model import TOP
    from kernelfleet.worker.tuner import resolve

    be = get_backend("cuda")
    dims = resolve(spec, shape, WARM_DTYPE)
    ahead = be.precompile(spec, _model_order(be, spec, dims, WARM_DTYPE)[: TOP + 1], dims, WARM_DTYPE, 1)
    return None if ahead is None else ahead.result()


def child_parts(kernel: str, shape: str) -> dict[str, Any]:
    """One tune's steps timed one by one (fresh process): inputs, reference, compiling the model
    strategy's candidates ahead (twice: a cold compile pool, then a warm one on the next six), and per
    candidate its first launch and verification, then the golden output."""
    import mlx.core as mx

    from kernelfleet.chips import detect_chip
    from kernelfleet.kernels.render import cuda_precompile
    from kernelfleet.worker.backends.registry import get_backend
    from kernelfleet.worker.golden import golden
    from kernelfleet.worker.search.model import TOP
    from kernelfleet.worker.tuner import get_spec, resolve

    clock, out = time.perf_counter, dict[str, Any]()
    be, spec = get_backend("cuda"), get_spec(kernel)
    dims = resolve(spec, shape, DTYPE)
    arch = str(detect_chip().arch)
    t = clock()
    inputs = spec.make_inputs(dims, DTYPE, 0)
    out["make_inputs_s"] = clock() - t
    t = clock()
    reference = spec.reference(inputs)
    mx.eval(inputs, reference)
    out["reference_s"] = clock() - t
    ordered = _model_order(be, spec, dims, DTYPE)
    chosen, after = ordered[: TOP + 1], ordered[TOP + 1: 2 * TOP + 1]
    for label, configs in (("precompile_cold", chosen[1:]), ("precompile_warm_pool", after)):
        t = clock()
        done = cuda_precompile.precompile(cuda_precompile.records_of(
            [(spec.build(c, "cuda", dims, DTYPE), inputs) for c in configs]), arch)
        out[label + "_s"] = clock() - t
        out[label] = f"{done.compiled} compiled, {len(done.failed)} failed"
    steps = []
    for config in chosen:
        fn = be.build(spec, config, dims, DTYPE)
        t = clock()
        outputs = fn(inputs)
        mx.eval(outputs)
        first = clock() - t
        t = clock()
        ok = spec.compare(outputs, reference, DTYPE).ok
        steps.append({"config": config, "first_launch_s": first, "verify_s": clock() - t, "ok": ok})
    out["candidates"] = steps
    t = clock()
    golden(spec.builtin(inputs))
    out["golden_s"] = clock() - t
    out["device"] = mx.device_info().get("device_name")
    return out


def child_gap(kernel: str, shape: str, keys: Sequence[str]) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    import kernels as kb  # benchmarks/kernels.py
    from kernelfleet.worker.tuner import get_spec, resolve

    spec = get_spec(kernel)
    return {"medians": kb.side_by_side(spec, resolve(spec, shape, DTYPE), DTYPE, keys)}  # type: ignore[attr-defined]


def _child(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any] | None:
    try:
        done = subprocess.run([sys.executable, "-P", __file__, *args], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"{args}: timed out after {timeout:.0f} s")
        return None
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        log(f"{args}: exit {done.returncode}: {done.stderr[-1500:]}")
        return None
    return dict(json.loads(lines[-1]))


def exhaustive_bests(path: Path) -> dict[tuple[str, str], str]:
    """Row -> exhaustive best config, from a ``frontier.sh STEP=search`` report's comparison table."""
    out: dict[tuple[str, str], str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"(\w+)\s+(\d+(?:x\d+)+)\s+\d+\s+.*\s(\S+) / (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


def _forget_custom_kernels(cache: Path) -> None:
    for path in cache.rglob("custom_kernel_*"):
        path.unlink()


def run(rows: Sequence[str], out: Path | None, exhaustive: Path, deadline: float) -> str:
    bests = exhaustive_bests(exhaustive)
    results: list[dict[str, Any]] = []
    cache = Path(tempfile.mkdtemp(prefix="kf-ptx-"))
    text = ""
    for i, row in enumerate(rows):
        if time.time() > deadline:
            log(f"deadline: {row} and later rows not run")
            break
        kernel, shape = row.split(":")
        got: dict[str, dict[str, Any] | None] = {}
        for mode in MODES[i % 3:] + MODES[: i % 3]:  # who goes first rotates by row
            env = dict(os.environ, MLX_PTX_CACHE_DIR=str(cache),
                       KERNELFLEET_CUDA_PRECOMPILE="0" if mode == "before" else "1",
                       **{POOL_STARTED_ENV: "1" if mode == "started" else "0"})
            got[mode] = _child(["row", kernel, shape], env, 240)
            _forget_custom_kernels(cache)
            log(f"{row} {mode}: {got[mode]}")
        picks = [r["pick"] for r in got.values() if r] + [bests.get((kernel, shape))]
        keys = [k for k in picks if k]
        gap = _child(["gap", kernel, shape, *dict.fromkeys(keys)], dict(os.environ), 240) if keys else None
        results.append({"kernel": kernel, "shape": shape, **got,
                        "exhaustive_best": bests.get((kernel, shape)), "medians": (gap or {}).get("medians")})
        text = table(results, exhaustive)
        if out:  # after every row: a run cut short keeps what it measured
            out.write_text(text)
            out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return text


def _ratio(medians: dict[str, float | None] | None, a: str | None, b: str | None) -> float | None:
    if not medians or not a or not b or medians.get(a) is None or medians.get(b) is None:
        return None
    return float(medians[a]) / float(medians[b])  # type: ignore[arg-type]


def table(results: Sequence[dict[str, Any]], exhaustive: Path) -> str:
    device = next((r[m]["device"] for r in results for m in MODES if r.get(m)), "?")
    lines = [f"# Tuning time per large shape, model strategy, {DTYPE} (benchmarks/tune_time.py; issue 16)",
             f"# device: {device}; every figure below from it, one machine, one run",
             "# before: MLX compiles each candidate at its first launch;",
             "# after: the tuner compiles them ahead, all at once in a pool of processes, into MLX's cache",
             "#   (the pool starts in the tune: every process is fresh);",
             "# started: as after, with the pool already running, as in a worker that has tuned before",
             "#   (started in the warm-up by compiling the same candidates for float16);",
             "# tune s: the whole tune_spec call (inputs, reference, compiles, measurement, golden output),",
             "# each in a fresh process after an untimed warm-up; MLX's own kernels cached, no custom kernel",
             "# exh./after, exh./started: exhaustive's best over that pick, timed side by side (200 rounds)",
             "",
             f"{'kernel':<14} {'shape':<14} {'before s':>8} {'after s':>8} {'started s':>9}  "
             f"{'before pick':<32} {'after pick':<32} {'started pick':<32} {'exh./after':>10} "
             f"{'exh./started':>12}"]
    times: dict[str, list[float]] = {m: [] for m in MODES}
    gaps: list[float] = []

    def num(v: float | None, width: int, digits: int) -> str:
        return f"{v if v is not None else float('nan'):>{width}.{digits}f}"

    for r in results:
        runs = {m: r.get(m) for m in MODES}
        for m, got in runs.items():
            if got:
                times[m].append(got["tune_s"])
        ratios = []
        for m in ("after", "started"):
            ex = _ratio(r["medians"], r["exhaustive_best"], (runs[m] or {}).get("pick"))
            ratios.append(ex)
            if ex is not None:
                gaps.append(1 / ex)
        lines.append(
            f"{r['kernel']:<14} {r['shape']:<14} "
            + " ".join(num((runs[m] or {}).get("tune_s"), w, 1)
                       for m, w in zip(MODES, (8, 8, 9), strict=True))
            + "  " + " ".join(f"{(runs[m] or {}).get('pick', '-'):<32}" for m in MODES)
            + f" {num(ratios[0], 10, 3)} {num(ratios[1], 12, 3)}")
    lines.append("")
    for m in MODES:
        if times[m]:
            within = sum(s <= TARGET_S for s in times[m])
            median = sorted(times[m])[len(times[m]) // 2]
            lines.append(f"{m}: median {median:.1f} s, max {max(times[m]):.1f} s per large shape "
                         f"(target <= {TARGET_S:.0f} s): {within}/{len(times[m])} within")
    for r in results:
        for m in ("after", "started"):
            if r.get(m):
                lines.append(f"  {r['kernel']} {m}: {r[m]['precompiled']}"
                             + (f"; pool started in the warm-up: {r[m]['pool_started']}"
                                if r[m].get("pool_started") else ""))
    if gaps:
        lines.append(f"after and started picks within {GAP:.0%} of exhaustive's best (side by side): "
                     f"{sum(g <= 1 + GAP for g in gaps)}/{len(gaps)}; worst {max(gaps):.3f} "
                     f"(exhaustive bests from {exhaustive.name})")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="before/after per row, then the side-by-side gap")
    r.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="kernel:shape,... (bfloat16)")
    r.add_argument("--out", type=Path)
    r.add_argument("--exhaustive", type=Path, default=RESULTS / "h100_frontier_search.txt",
                   help="a frontier.sh STEP=search report naming exhaustive bests")
    r.add_argument("--time-limit", type=float, default=500.0, help="start no row after this many seconds")
    c = sub.add_parser("row", help="(child) one tune")
    c.add_argument("kernel")
    c.add_argument("shape")
    t = sub.add_parser("parts", help="one tune's steps timed one by one")
    t.add_argument("kernel")
    t.add_argument("shape")
    g = sub.add_parser("gap", help="(child) configs side by side")
    g.add_argument("kernel")
    g.add_argument("shape")
    g.add_argument("keys", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "row":
        print(json.dumps(child_row(args.kernel, args.shape)))
    elif args.cmd == "parts":
        print(json.dumps(child_parts(args.kernel, args.shape), indent=1))
    elif args.cmd == "gap":
        print(json.dumps(child_gap(args.kernel, args.shape, args.keys)))
    else:
        print(run(args.rows.split(","), args.out, args.exhaustive, time.time() + args.time_limit), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
