"""Repeatability: tune the same kernel and shape twice on one machine; the picked configs'
medians must agree within 3%.

    python benchmarks/repeatability.py --out results/new/repeatability.txt

(benchmarks/multi_gpu.sh measures the same over the catalog, beside the kernel table.)

Each pair is the same halving tune run twice in one process (same seed and inputs, fresh
measurements). Two figures: |m1 - m2| / min(m1, m2) of the two picks' reported medians (measured
apart, so the machine's drift between the tunes counts too), and the same of the two picks timed
again side by side (``kernels.side_by_side``; 0 when both tunes picked the same config).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("kf_bench_kernels", Path(__file__).with_name("kernels.py"))
assert _spec and _spec.loader
kb: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kb)

from kernelfleet.chips import detect_chip  # noqa: E402
from kernelfleet.kernels.catalog import all_specs, get_spec  # noqa: E402
from kernelfleet.kernels.spec import format_shape  # noqa: E402
from kernelfleet.worker.backends import detect_backend  # noqa: E402
from kernelfleet.worker.tuner import tune_spec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", help="default: every catalog kernel")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kinds", default="large,decode")
    ap.add_argument("--out")
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    deadline = time.monotonic() + args.time_limit
    chip, be = detect_chip(), detect_backend()
    specs = [get_spec(k) for k in args.kernels.split(",")] if args.kernels else all_specs()
    lines = [f"# {chip.name} ({chip.arch}), backend {be.name}, MLX {chip.mlx_version}",
             f"{'kernel':<20} {'kind':<6} {'shape':<12} {'dtype':<8} {'pick 1':<26} {'µs':>9} {'pick 2':<26} "
             f"{'µs':>9} {'diff':>7} {'side':>7}"]
    diffs, sides = [], []
    for kind in args.kinds.split(","):
        for spec in specs:
            if time.monotonic() > deadline or not spec.shapes.get(kind):
                continue
            dtype = args.dtype if args.dtype in spec.dtypes else spec.dtypes[-1]
            shape = tuple(spec.shapes[kind][0])
            try:
                picks = []
                for _ in range(2):  # the same command twice: a fresh measurer and fresh rounds each time
                    cached = kb.cached_spec(spec.name)
                    rep = tune_spec(cached, shape, dtype, seed=0, strategy="halving").report
                    best = next(t for t in rep["trials"] if t["config_key"] == rep["best_config_key"])
                    picks.append((rep["best_config_key"], best["median_us"]))
            except Exception as e:  # noqa: BLE001
                print(f"{spec.name} {kind}: FAILED {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                continue
            (k1, m1), (k2, m2) = picks
            diff = abs(m1 - m2) / min(m1, m2)
            diffs.append(diff)
            side = kb.side_by_side_gap(kb.cached_spec(spec.name), shape, dtype, k1, k2)
            if side is not None:
                sides.append(side)
            lines.append(f"{spec.name:<20} {kind:<6} {format_shape(shape):<12} {dtype:<8} "
                         f"{k1:<26} {m1:>9.2f} "
                         f"{k2:<26} {m2:>9.2f} {100 * diff:>6.2f}% "
                         + (f"{100 * side:>6.2f}%" if side is not None else f"{'failed':>7}"))
            print(lines[-1], file=sys.stderr, flush=True)
            if args.out:
                Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if diffs:
        lines += ["", f"pairs within 3%, reported medians: {sum(d <= 0.03 for d in diffs)}/{len(diffs)}; "
                      f"worst {100 * max(diffs):.2f}%, median {100 * sorted(diffs)[len(diffs) // 2]:.2f}%"]
    if sides:
        lines.append(f"pairs within 3%, side by side: {sum(d <= 0.03 for d in sides)}/{len(sides)}; "
                     f"worst {100 * max(sides):.2f}%")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
