"""Does a side-by-side timing reproduce itself? Fresh measurements of the same configs by the
Measurer as it was before 2026-11-27 (K, the launches per round, read from one short calibration
pass and never revised) and as it is now (K checked by a full round, and scaled up after a timed
round that lasts under half of 4 ms).

    python3 benchmarks/referee_check.py --out $OUT/referee_check.txt     # on the GPU host

Why: in ``results/h100_transfer.jsonl`` (NVIDIA H100 80GB HBM3) one config per row was sometimes
timed 1.1-1.8x slower by the side-by-side referee than by the tune minutes before in the same
process, with a wide spread (add_rmsnorm 4096x4096 hint=1: 53.3 µs in the tune, 74-181 µs in the
referee), while the others in those rounds matched their tune within 3 %. A round of too few launches
is mostly its fixed start-and-drain cost; K read from a short pass that paid a one-time or passing
cost is too small. The cases are those rows (and one from the H200 run of 2026-11-27: moe_combine
16384x2x4096 hint=2, K 8), with the configs the referee timed.

Found (``results/h200_referee_check.txt``, ``results/h100_referee_check.txt``): on an NVIDIA H200 the
Measurer before left 4 of 54 config measurements with K 6-31 where 10-74 were due, their medians
3-5 % high, and none of 54 now; on an NVIDIA H100 80GB HBM3, in a process of its own, no config was
timed apart from its peers either way: the cross-chip run's 1.1-1.8x disagreements belong to that run.

For each case, ``--repeats`` times, before then now (so drift hits both alike): a fresh Measurer
times the configs side by side, ``--rounds`` interleaved rounds; per config: launches per round,
the calibration's per-launch µs, the resizes, median, p10 and p90.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("kf_bench_kernels", Path(__file__).with_name("kernels.py"))
assert _spec and _spec.loader
kb: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kb)

import mlx.core as mx  # noqa: E402

from kernelfleet.chips import detect_chip  # noqa: E402
from kernelfleet.kernels.catalog import get_spec  # noqa: E402
from kernelfleet.kernels.spec import parse_shape  # noqa: E402

CASES = [
    ("add_rmsnorm", "4096x4096", ["hint=1,rpg=1,tg=512,vec=8", "rpg=1,tg=256,vec=8", "builtin"]),
    ("int4_dequantize", "8192x8192", ["ipt=1,tg=128,vec=1", "ipt=2,tg=64,vec=1", "builtin"]),
    ("softmax", "4096x4096", ["rpg=1,tg=256,vec=1", "rpg=1,tg=128,vec=1", "builtin"]),
    ("topk_gating_softmax", "16384x256", ["tg=512,vec=4", "tg=128,vec=1", "builtin"]),
    ("moe_combine", "16384x2x4096", ["hint=2,ipt=1,tg=1024,vec=8", "ipt=1,tg=256,vec=8", "builtin"]),
]
# before: K from one short pass, never revised (the Measurer until 2026-11-27); now: the defaults
MODES: dict[str, dict[str, Any]] = {"before": {"check_rounds": 0, "resize_rounds": False}, "now": {}}
CACHE_BYTES = 8 << 30  # as session.TURN_CACHE_BYTES: the cache a cross-chip unit times with


def measure_case(kernel: str, shape: str, keys: list[str], rounds: int, repeats: int) -> list[dict[str, Any]]:
    spec = kb.memoize_inputs(get_spec(kernel), 2)
    rows = []
    for rep in range(repeats):
        for mode, kw in MODES.items():
            measurer, _ = kb.side_by_side_measured(spec, parse_shape(shape), "bfloat16", keys, rounds,
                                                   seed=rep, **kw)
            for key in keys:
                t = measurer.trials[key]
                stats = t.to_report()
                rows.append({"kernel": kernel, "shape": shape, "repeat": rep, "mode": mode, "config": key,
                             "status": t.status, "k": t.launches_per_round, "resized": t.resized,
                             "calibration_us": t.calibration_us,
                             **{k: stats[k] for k in ("median_us", "p10_us", "p90_us")}})
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    out = [f"{'kernel':<20} {'shape':<10} {'config':<26} {'rep':>3} {'mode':<9} {'K':>5} {'cal µs':>7} "
           f"{'resized':>7} {'median':>7} {'p10':>7} {'p90':>7}"]
    for r in rows:
        out.append(f"{r['kernel']:<20} {r['shape']:<10} {r['config']:<26} {r['repeat']:>3} {r['mode']:<9} "
                   f"{r['k']:>5} {f(r['calibration_us']):>7} {r['resized']:>7} {f(r['median_us']):>7} "
                   f"{f(r['p10_us']):>7} {f(r['p90_us']):>7}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    mx.set_cache_limit(CACHE_BYTES)
    rows: list[dict[str, Any]] = []
    for kernel, shape, keys in CASES:
        rows += measure_case(kernel, shape, keys, args.rounds, args.repeats)
        print(f"{kernel} {shape} done", file=sys.stderr, flush=True)
    lines = [f"referee check on {detect_chip().name}: {args.repeats} repeats x (before, now), "
             f"{args.rounds} side-by-side rounds each; K = launches per round (at the end); cal µs = the "
             "calibration's last per-launch time; resized = timed rounds under 2 ms that scaled K up",
             *table(rows)]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
