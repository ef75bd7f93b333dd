"""Tuning time per large shape, with and without compiling the candidates ahead (issue 16).

    # on the GPU host, after `source .mlxcuda/b/setup.sh`, kernels/ and worker/ copied to
    # /tmp/kf/kernelfleet and PYTHONPATH=/tmp/kf:$PYTHONPATH (as benchmarks/frontier.sh does):
    python3 -P benchmarks/tune_time.py run --out $OUT/tune_time.txt [--rows rmsnorm:16384x8192,...]
    python3 -P benchmarks/tune_time.py parts rmsnorm 16384x8192     # where one tune's time goes

For every row, two fresh processes tune the shape with the ``model`` strategy (the worker's default
for large shapes: the cost model's 6 candidates and the built-in): **before**, every custom candidate
compiled by MLX at its first launch, one after another (``KERNELFLEET_CUDA_PRECOMPILE=0``); **after**,
the tuner's CUDA backend compiling them ahead, all at once in a pool of processes, into MLX's PTX
cache (:mod:`kernelfleet.kernels.cuda_precompile`) while numpy makes the inputs. The two run in
turn (which goes first alternates by row), after an untimed warm-up in the same process (the row's
inputs, its built-in and one verification against the reference: a long-running worker has its CUDA
context and MLX's own kernels already). All processes share one MLX cache directory, as a worker's
tunes do, so MLX's own kernels (the built-ins, the fused verification kernel: 25 s to compile the
first time on an H100 host) come from disk after the first; every custom kernel is deleted from it
after each process, so no tune finds another's. ``tune s`` is the whole ``tune_spec`` call: inputs,
reference, compiles, measurement, golden output.

Then one more process times side by side (``kernels.side_by_side``, 200 interleaved rounds) the
after pick, the before pick and, where ``--exhaustive`` names one for this row, the exhaustive
search's best: the pick's gap to exhaustive's best.
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
    warm_s = time.perf_counter() - t0
    outcome = tune_spec(spec, shape, DTYPE, strategy="model", backend="cuda")
    return {"kernel": kernel, "shape": shape, "pick": outcome.report["best_config_key"],
            "tune_s": outcome.total_s, "prepare_s": outcome.prepare_s, "measure_s": outcome.measure_s,
            "precompiled": outcome.precompiled, "warm_s": warm_s,
            "measured": len(outcome.trials), "device": mx.device_info().get("device_name")}


def child_parts(kernel: str, shape: str) -> dict[str, Any]:
    """One tune's steps timed one by one (fresh process): inputs, reference, compiling the model
    strategy's candidates ahead (twice: a cold compile pool, then a warm one on the next six), and per
    candidate its first launch and verification, then the golden output."""
    import mlx.core as mx

    from kernelfleet.kernels import cuda_precompile
    from kernelfleet.worker.backends.registry import get_backend
    from kernelfleet.worker.chip import detect_chip
    from kernelfleet.worker.golden import golden
    from kernelfleet.worker.search.model import TOP, prior_order
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
    ordered = prior_order(spec, dims, DTYPE, be.candidates(spec, dims, DTYPE))
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
        for mode in (("before", "after") if i % 2 == 0 else ("after", "before")):
            env = dict(os.environ, MLX_PTX_CACHE_DIR=str(cache),
                       KERNELFLEET_CUDA_PRECOMPILE="0" if mode == "before" else "1")
            got[mode] = _child(["row", kernel, shape], env, 240)
            _forget_custom_kernels(cache)
            log(f"{row} {mode}: {got[mode]}")
        before, after = got["before"], got["after"]
        picks = (after and after["pick"], before and before["pick"], bests.get((kernel, shape)))
        keys = [k for k in picks if k]
        gap = _child(["gap", kernel, shape, *dict.fromkeys(keys)], dict(os.environ), 240) if keys else None
        results.append({"kernel": kernel, "shape": shape, "before": before, "after": after,
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
    device = next((r[m]["device"] for r in results for m in ("after", "before") if r[m]), "?")
    lines = [f"# Tuning time per large shape, model strategy, {DTYPE} (benchmarks/tune_time.py; issue 16)",
             f"# device: {device}; every figure below from it, one machine, one run",
             "# before: MLX compiles each candidate at its first launch;",
             "# after: the tuner compiles them ahead, all at once in a pool of processes, into MLX's cache",
             "# tune s: the whole tune_spec call (inputs, reference, compiles, measurement, golden output),",
             "# each in a fresh process after an untimed warm-up; MLX's own kernels cached, no custom kernel",
             "# exh./after: exhaustive's best over the after pick, timed side by side (200 rounds)",
             "",
             f"{'kernel':<14} {'shape':<14} {'before s':>8} {'after s':>8} {'speed-up':>8}  "
             f"{'after pick':<34} {'before pick':<34} {'exh./after':>10}  precompiled"]
    after_s: list[float] = []
    gaps: list[float] = []
    for r in results:
        b, a = r["before"], r["after"]
        bs, as_ = (b["tune_s"] if b else None), (a["tune_s"] if a else None)
        if as_ is not None:
            after_s.append(as_)
        ex = _ratio(r["medians"], r["exhaustive_best"], a and a["pick"])
        if ex is not None:
            gaps.append(1 / ex)
        lines.append(
            f"{r['kernel']:<14} {r['shape']:<14} {bs if bs is not None else float('nan'):>8.1f} "
            f"{as_ if as_ is not None else float('nan'):>8.1f} "
            f"{(bs / as_) if bs and as_ else float('nan'):>7.2f}x  {(a or {}).get('pick', '-'):<34} "
            f"{(b or {}).get('pick', '-'):<34} {ex if ex is not None else float('nan'):>10.3f}  "
            f"{(a or {}).get('precompiled')}")
    lines.append("")
    if after_s:
        within = sum(s <= TARGET_S for s in after_s)
        median = sorted(after_s)[len(after_s) // 2]
        lines.append(f"after: median {median:.1f} s, max {max(after_s):.1f} s per "
                     f"large shape (target <= {TARGET_S:.0f} s): {within}/{len(after_s)} within")
    if gaps:
        lines.append(f"after pick within {GAP:.0%} of exhaustive's best (side by side): "
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
