"""Search efficiency: successive halving vs exhaustive search over the catalog, on this GPU.

    python benchmarks/search.py --out results/new/search.txt

(benchmarks/multi_gpu.sh runs this comparison for every kernel, beside the kernel table.)

Per kernel (its first large shape, bfloat16): a throwaway pass builds, verifies and warms every
candidate (so neither strategy pays compilation or module loading, which both would pay alike),
then halving and exhaustive search run with the same seed. Quality, target <= 1.03: halving's
pick over the exhaustive best, (a) in the exhaustive run's own medians (the same interleaved rounds;
the best of ~60 noisy medians is biased low) and (b) side by side: the two picks timed again
together (``kernels.side_by_side``, 200 rounds; 1.0 when both searches picked the same config).
Cost, target <= 0.30: halving's wall time over exhaustive's (whole tune, and timed rounds only).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("kf_bench_kernels", Path(__file__).with_name("kernels.py"))
assert _spec and _spec.loader
kb: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kb)

import mlx.core as mx  # noqa: E402

from kernelfleet.chips import detect_chip  # noqa: E402
from kernelfleet.kernels.catalog import all_specs, get_spec  # noqa: E402
from kernelfleet.kernels.spec import KernelSpec, format_shape, parse_shape  # noqa: E402
from kernelfleet.worker.backends import detect_backend  # noqa: E402
from kernelfleet.worker.measure import Measurer  # noqa: E402
from kernelfleet.worker.tuner import tune_spec  # noqa: E402


def warm(spec: KernelSpec, shape: tuple[int, ...], dtype: str, seed: int) -> None:
    """Build, verify, warm up and calibrate every candidate once, in this process (and generate
    the seeded inputs, memoized by ``spec``, so neither timed strategy pays for them)."""
    be = detect_backend()
    inputs = spec.make_inputs(shape, dtype, seed)
    ref = spec.reference(inputs)
    mx.eval(inputs, ref)
    m = Measurer(spec, be, shape, dtype, inputs, ref, be.candidates(spec, shape, dtype))
    m.prepare(list(m.trials))


def compare(spec: KernelSpec, shape: tuple[int, ...], dtype: str, seed: int) -> dict[str, Any]:
    """Halving vs exhaustive on ``spec`` (whose ``make_inputs`` is memoized: kernels.memoize_inputs)."""
    name = spec.name
    warm(spec, shape, dtype, seed)
    hv = tune_spec(spec, shape, dtype, strategy="halving", seed=seed)
    ex = tune_spec(spec, shape, dtype, strategy="exhaustive", seed=seed)
    ex_med = {t["config_key"]: t["median_us"] for t in ex.report["trials"] if t["status"] == "ok"}
    hv_med = {t["config_key"]: t["median_us"] for t in hv.report["trials"] if t["status"] == "ok"}
    ex_best, hv_best = ex.report["best_config_key"], hv.report["best_config_key"]
    # the referee: both picks timed again, side by side (exhaustive's best of ~60 medians is biased low)
    referee: float | None = 1.0  # the same config
    if hv_best != ex_best:
        ref = kb.side_by_side(spec, shape, dtype, [ex_best, hv_best], seed=seed)
        referee = ref[hv_best] / ref[ex_best] if ref[hv_best] and ref[ex_best] else None  # None: failed
    return {"kernel": name, "shape": format_shape(shape), "dtype": dtype, "candidates": len(ex_med),
            "ex_best": ex_best, "ex_best_us": ex_med[ex_best], "hv_best": hv_best,
            "hv_best_us": hv_med[hv_best], "quality": ex_med[hv_best] / ex_med[ex_best], "referee": referee,
            "hv_s": hv.prepare_s + hv.measure_s, "ex_s": ex.prepare_s + ex.measure_s,
            "hv_prepare_s": hv.prepare_s, "ex_prepare_s": ex.prepare_s,
            "time_ratio": (hv.prepare_s + hv.measure_s) / (ex.prepare_s + ex.measure_s),
            "whole_ratio": hv.total_s / ex.total_s}


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison table and its verdict lines."""
    lines = [f"{'kernel':<20} {'shape':<12} {'dtype':<8} {'cands':>5} {'exhaustive best':<26} "
             f"{'µs':>9} {'halving pick':<26} {'µs':>9} {'pick/best':>9} {'side/side':>9} {'halving s':>9} "
             f"{'exh. s':>8} {'search %':>8} {'whole %':>7} {'verify+warm s h/e':>17}"]
    for r in rows:
        prep = (f"{r['hv_prepare_s']:>8.2f}/{r['ex_prepare_s']:<8.2f}" if "hv_prepare_s" in r else "")
        lines.append(f"{r['kernel']:<20} {r['shape']:<12} {r['dtype']:<8} {r['candidates']:>5} "
                     f"{r['ex_best']:<26} {r['ex_best_us']:>9.2f} {r['hv_best']:<26} {r['hv_best_us']:>9.2f} "
                     f"{r['quality']:>9.3f} {_opt(r.get('referee'))} {r['hv_s']:>9.2f} {r['ex_s']:>8.2f} "
                     f"{100 * r['time_ratio']:>7.0f}% {100 * r['whole_ratio']:>6.0f}% {prep:>17}")
    if rows:
        ok_q = sum(r["quality"] <= 1.03 for r in rows)
        ok_t = sum(r["time_ratio"] <= 0.30 for r in rows)
        refs = [r["referee"] for r in rows if r.get("referee") is not None]
        gm_t = math.exp(sum(math.log(r["time_ratio"]) for r in rows) / len(rows))
        gm_w = math.exp(sum(math.log(r["whole_ratio"]) for r in rows) / len(rows))
        total = sum(r["hv_s"] for r in rows) / sum(r["ex_s"] for r in rows)
        lines += ["", "search s = verifying, warming, calibrating and timing candidates (compilation "
                      "excluded: a warm-up pass compiled every candidate first); whole % = entire tune "
                      "calls, including input generation, the reference and the golden output",
                  f"halving pick within 3% of the exhaustive best (exhaustive's own timings): "
                  f"{ok_q}/{len(rows)}; worst pick/best {max(r['quality'] for r in rows):.3f}",
                  *([f"halving pick within 3% of the exhaustive best (the two picks side by side): "
                     f"{sum(x <= 1.03 for x in refs)}/{len(refs)}; worst {max(refs):.3f}"] if refs else []),
                  f"halving search time <= 30% of exhaustive: {ok_t}/{len(rows)}; over the catalog "
                  f"{100 * total:.0f}% (sum of halving s / sum of exhaustive s); geometric mean "
                  f"{100 * gm_t:.0f}%, worst {100 * max(r['time_ratio'] for r in rows):.0f}%; "
                  f"whole-tune geometric mean {100 * gm_w:.0f}%"]
    return "\n".join(lines)


def _opt(x: float | None) -> str:
    return f"{x:>9.3f}" if x is not None else f"{'-':>9}"


def report(rows: list[dict[str, Any]], chip: Any, be: Any, out: str | None, final: bool = True) -> None:
    text = f"# {chip.name} ({chip.arch}), backend {be.name}, MLX {chip.mlx_version}\n" + table(rows)
    if final:
        print(text, flush=True)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--shape", help="use this shape for every kernel instead of its first large shape")
    args = ap.parse_args()
    deadline = time.monotonic() + args.time_limit
    chip, be = detect_chip(), detect_backend()
    specs = [get_spec(k) for k in args.kernels.split(",")] if args.kernels else all_specs()
    rows = []
    for spec in specs:
        if time.monotonic() > deadline:
            kb.log("time limit reached")
            break
        dtype = args.dtype if args.dtype in spec.dtypes else spec.dtypes[-1]
        shape = parse_shape(args.shape) if args.shape else tuple(spec.shapes["large"][0])
        kb.log(f"search {spec.name} {format_shape(shape)} {dtype}")
        try:
            seed = args.seed + random.Random(spec.name).randrange(1000)
            rows.append(compare(kb.cached_spec(spec.name), shape, dtype, seed))
        except Exception as e:  # noqa: BLE001 - report and go on
            kb.log(f"  FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        r = rows[-1]
        kb.log(f"  quality {r['quality']:.3f}, search {r['time_ratio']:.2f}, whole {r['whole_ratio']:.2f}")
        report(rows, chip, be, args.out, final=False)  # rewritten per kernel: a killed run keeps its rows
    report(rows, chip, be, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
