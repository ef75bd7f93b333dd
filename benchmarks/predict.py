"""Learned predictions on held-out shapes, on real tuning data measured on a GPU.

    python benchmarks/predict.py [FILE.jsonl ...]   # default: the GPU files below -> results/predict.txt

Input: tuning reports (one JSON per line, as ``kernelfleet tune --out`` writes them). For every
(chip, kernel, shape, dtype) in the file, that shape is held out: its reports are removed and the
coordinator's predictor (``kernelfleet.service.predict.predict``, the code that fills profiles)
picks a config from everything else (the chip's other shapes and dtypes of that kernel, other
chips if the file has them), restricted to the configs the kernel's space allows at that shape.
The pick is then scored on the held-out shape's own trials: its measured median against the
tuned best of that shape (the best correct trial, built-in included). A pick the held-out run did
not measure counts as a miss. Exhaustive runs measure every candidate, so every pick can be scored.

Baselines on the same held-out shapes: the kernel's default config (what the runtime runs without
a profile) and the MLX built-in.

Scoring on the reports compares medians from different measurements, and the tuned best is the
fastest of many noisy medians (biased low); a pick only screened by halving has one sample. So the
picks are also scored side by side on the GPU:

    python benchmarks/predict.py --jobs results/new/predict_jobs.jsonl          # then on an H100:
    OUT=/tmp/run JOBS=.../predict_jobs.jsonl bash benchmarks/multi_gpu.sh       # side_by_side_h100.jsonl
    python benchmarks/predict.py --side-by-side results/h100_predict_side_by_side.jsonl  # (the default)

A job holds a held-out shape's tuned best, the pick, the default and the built-in; the GPU times
them together (``kernels.side_by_side``) and each is scored against the tuned best's new median
(a pick equal to the tuned best scores 1.0 without a job).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from kernelfleet.service.predict import ChipTable, predict
from kernelfleet.service.profiles import _validator

RESULTS = Path(__file__).parent / "results"
# real GPU measurements: kernels.py runs on an H100 and an H200, the H100 worker campaign (exhaustive,
# 4 row-wise kernels x 5 row counts) exported from its coordinator's database, and the H100 session
# (multi_gpu.sh: every kernel's table shapes, halving; then a spread-only run: exhaustive, more row counts)
GPU_FILES = ("h100_tuning.jsonl", "h100_fleet_tuning.jsonl", "h200_tuning.jsonl", "h100_session_tuning.jsonl",
             "h100_spread_tuning.jsonl")
# the picks of the rule in service/predict.py (jobs: h100_predict_jobs.jsonl) timed again on an H100, twice
# (kernels.side_by_side at 60 and at 200 rounds)
SIDE_BY_SIDE_FILES = ("h100_predict_side_by_side.jsonl", "h100_predict_side_by_side_run2.jsonl")
Key = tuple[str, str, str, str]  # chip, kernel, shape, dtype


def load(paths: list[Path]) -> tuple[dict[Key, dict[str, float]], dict[Key, str]]:
    """Median time per config per (chip, kernel, shape, dtype) over the files' correct trials."""
    samples: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    strategies: dict[Key, str] = {}
    lines = [line for path in paths for line in path.read_text().splitlines()]
    for line in lines:
        if not line.strip():
            continue
        r = json.loads(line)
        key = (r["env"]["chip"], r["kernel"], r["shape"], r["dtype"])
        strategies[key] = r.get("strategy", "")
        for t in r["trials"]:
            if t["status"] == "ok" and t.get("median_us"):
                samples[key][t["config_key"]].append(float(t["median_us"]))
    times = {k: {c: statistics.median(v) for c, v in configs.items()} for k, configs in samples.items()}
    return times, strategies


def default_key(kernel: str, shape: str, dtype: str) -> str | None:
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import config_key, parse_shape

        return config_key(get_spec(kernel).default_config(parse_shape(shape), dtype))
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="*", type=Path, default=[RESULTS / n for n in GPU_FILES])
    parser.add_argument("--out", type=Path, default=RESULTS / "predict.txt")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--jobs", type=Path, help="write side-by-side jobs (JSON lines) for the held-out "
                        "shapes of --chip whose pick is not the tuned best, for multi_gpu.sh (JOBS=)")
    parser.add_argument("--chip", default="H100",
                        help="the chip (a part of its name) of --jobs / --side-by-side")
    parser.add_argument("--side-by-side", type=Path, action="append",
                        help="score the picks on these side-by-side results too (multi_gpu.sh with JOBS=); "
                        "default with the default data: " + ", ".join(SIDE_BY_SIDE_FILES))
    args = parser.parse_args(argv)
    missing = [p for p in args.data if not p.exists()]
    if missing:
        print(
            f"no tuning data at {missing[0]}: run `kernelfleet tune ... --strategy exhaustive "
            f"--out {missing[0]}` on a GPU first",
            file=sys.stderr,
        )
        return 2
    times, strategies = load(args.data)
    observations: dict[str, ChipTable] = defaultdict(dict)
    for (chip, kernel, shape, dtype), configs in times.items():
        observations[chip][(kernel, shape, dtype)] = configs

    rows: list[dict[str, Any]] = []
    for key, configs in sorted(times.items()):
        chip, kernel, shape, dtype = key
        best = min(configs.values())
        guess = predict(
            chip, kernel, shape, dtype, observations, valid=_validator(kernel, shape, dtype), exclude={key}
        )
        row: dict[str, Any] = {
            "key": key,
            "strategy": strategies[key],
            "best": best,
            "best_key": min(configs, key=configs.__getitem__),
            "n_configs": len(configs),
        }
        if guess is None:
            row["pick"] = None
        else:
            row["pick"] = guess.config_key
            row["ratio"] = configs[guess.config_key] / best if guess.config_key in configs else None
        dk = default_key(kernel, shape, dtype)
        row["default_key"] = dk
        row["default_ratio"] = configs[dk] / best if dk in configs else None
        row["builtin_ratio"] = configs["builtin"] / best if "builtin" in configs else None
        rows.append(row)

    if args.jobs:
        jobs = side_by_side_jobs(rows, args.chip)
        args.jobs.parent.mkdir(parents=True, exist_ok=True)
        args.jobs.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        print(f"{len(jobs)} side-by-side jobs for {args.chip} -> {args.jobs}", file=sys.stderr)
    tol = 1 + args.tolerance

    def within(ratios: list[float | None]) -> str:
        hits = sum(1 for r in ratios if r is not None and r <= tol)
        return f"{hits}/{len(ratios)} = {hits / len(ratios):.1%}" if ratios else "-"

    chips = sorted({r["key"][0] for r in rows})
    lines = [
        "Learned predictions on held-out shapes (benchmarks/predict.py)",
        f"data: {', '.join(p.name for p in args.data)}",
        f"chips: {', '.join(chips)}; {len(rows)} (kernel, shape, dtype) "
        f"held out one at a time; strategies: {dict(sorted(_count(r['strategy'] for r in rows).items()))}",
        f"score: the pick's measured median on the held-out shape within {args.tolerance:.0%} of that "
        "shape's tuned best (an unmeasured pick is a miss)",
        "",
        f"predicted config  within {args.tolerance:.0%}: "
        f"{within([r.get('ratio') for r in rows if r['pick']])}"
        f"  (no prediction possible: {sum(1 for r in rows if r['pick'] is None)})",
        f"kernel default    within {args.tolerance:.0%}: {within([r['default_ratio'] for r in rows])}",
        f"MLX built-in      within {args.tolerance:.0%}: {within([r['builtin_ratio'] for r in rows])}",
        "",
        "per kernel                 predicted        default          built-in    "
        "median slowdown of the pick",
    ]
    for kernel in sorted({r["key"][1] for r in rows}):
        sub = [r for r in rows if r["key"][1] == kernel]
        picked = [r.get("ratio") for r in sub if r["pick"]]
        slow = [r for r in picked if r is not None]
        lines.append(
            f"  {kernel:22s} {within(picked):>14s}  {within([r['default_ratio'] for r in sub]):>14s}  "
            f"{within([r['builtin_ratio'] for r in sub]):>14s}    "
            f"{(statistics.median(slow) - 1) * 100 if slow else float('nan'):+.1f}%"
        )
    side_by_side = args.side_by_side
    if side_by_side is None and args.data == parser.get_default("data"):
        side_by_side = [RESULTS / n for n in SIDE_BY_SIDE_FILES if (RESULTS / n).exists()]
    for path in side_by_side or []:  # one section per run: two runs show the referee's own noise
        lines += ["", *side_by_side_lines(rows, path, args.chip, within, tol)]
    misses = [r for r in rows if r["pick"] and (r.get("ratio") is None or r["ratio"] > tol)]
    lines += ["", f"misses ({len(misses)}):"]
    for r in misses:
        ratio = "not measured" if r.get("ratio") is None else f"{(r['ratio'] - 1) * 100:+.1f}%"
        lines.append(f"  {' '.join(r['key'][1:])}: picked {r['pick']} ({ratio}), best {r['best_key']}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


def side_by_side_jobs(rows: list[dict[str, Any]], chip: str) -> list[dict[str, Any]]:
    """One job per held-out shape of ``chip`` whose pick is not its tuned best: the configs to time
    together (tuned best first, then the pick, the default and the built-in)."""
    jobs = []
    for r in rows:
        c, kernel, shape, dtype = r["key"]
        if chip in c and r["pick"] and r["pick"] != r["best_key"]:
            configs = [k for k in (r["best_key"], r["pick"], r["default_key"], "builtin") if k]
            jobs.append({"chip": c, "kernel": kernel, "shape": shape, "dtype": dtype,
                         "configs": list(dict.fromkeys(configs))})
    return jobs


def side_by_side_lines(rows: list[dict[str, Any]], path: Path, chip: str, within: Any,
                       tol: float) -> list[str]:
    """The held-out shapes of ``chip`` scored on one side-by-side run: each config's median over the
    tuned best's median in the same measurement. A pick equal to the tuned best scores 1.0 untimed;
    the default and the built-in are compared with the pick on the timed shapes only."""
    measured: dict[Key, dict[str, float | None]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            j = json.loads(line)
            measured[(j["chip"], j["kernel"], j["shape"], j["dtype"])] = j["medians"]
    picks: list[float | None] = []
    timed: dict[str, list[float | None]] = {"pick": [], "default": [], "builtin": []}
    misses, untimed = [], 0
    for r in rows:
        if chip not in r["key"][0] or not r["pick"]:
            continue
        if r["pick"] == r["best_key"]:
            picks.append(1.0)
            continue
        medians = measured.get(r["key"])
        if medians is None:
            untimed += 1
            continue
        best = medians.get(r["best_key"])
        for name, key in (("pick", r["pick"]), ("default", r["default_key"]), ("builtin", "builtin")):
            t = medians.get(key) if key else None
            timed[name].append(t / best if t and best else None)
        picks.append(timed["pick"][-1])
        if picks[-1] is None or picks[-1] > tol:
            ratio = "failed" if picks[-1] is None else f"{(picks[-1] - 1) * 100:+.1f}%"
            misses.append(f"{' '.join(r['key'][1:3])} {r['pick']} ({ratio} vs {r['best_key']})")
    n = len(timed["pick"])
    return [
        f"side by side on the GPU ({path.name}): {chip} held-out shapes; {n} picks that are not the tuned "
        f"best timed again beside it" + (f", {untimed} not timed (left out)" if untimed else ""),
        f"predicted config  within {tol - 1:.0%}: {within(picks)}   "
        "(a pick equal to the tuned best counts 1.0)",
        f"on the {n} timed shapes: predicted {within(timed['pick'])}, kernel default "
        f"{within(timed['default'])}, MLX built-in {within(timed['builtin'])}",
        f"misses: {'; '.join(misses) or 'none'}",
    ]


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for i in items:
        out[i] += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
