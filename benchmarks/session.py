"""All three GPU benchmarks for a few kernels in ONE process, kernel by kernel.

On MLX's CUDA backend a custom kernel is compiled by NVRTC the first time it runs (about 1.5 s
per candidate on the H100 host) and the compiled module lives only in that process; custom
kernels are not in MLX's on-disk PTX cache. So the cheapest complete measurement of a kernel is:
tune it once (pays compilation; gives the kernel-table row and a tuning report), then compare
halving with exhaustive search on the now-compiled candidates, then tune twice more for
repeatability -- all in the same process.

    python benchmarks/session.py --kernels logsumexp,bias_gelu --outdir results/
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"kf_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kb, sb = _load("kernels"), _load("search")

from kernelfleet.kernels.catalog import get_spec  # noqa: E402
from kernelfleet.kernels.spec import format_shape, parse_shape  # noqa: E402
from kernelfleet.worker.backends import detect_backend  # noqa: E402
from kernelfleet.worker.chip import detect_chip  # noqa: E402
from kernelfleet.worker.tuner import tune_spec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", required=True)
    ap.add_argument("--shape", help="one shape for every kernel (default: each kernel's first large shape)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--outdir", default=".")
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--time-limit", type=float, default=600.0)
    args = ap.parse_args()
    deadline = time.monotonic() + args.time_limit
    out = Path(args.outdir)
    chip, be = detect_chip(), detect_backend()
    bw = kb.copy_bandwidth(be.name, 1 << 30 if be.supports_custom_kernels else 1 << 26)
    kb.log(f"{chip.name}: copy bandwidth {bw}")
    results: list[dict[str, Any]] = []
    for name in args.kernels.split(","):
        if time.monotonic() > deadline:
            kb.log("time limit reached")
            break
        spec = get_spec(name)
        dtype = args.dtype if args.dtype in spec.dtypes else spec.dtypes[-1]
        shape = parse_shape(args.shape) if args.shape else tuple(spec.shapes["large"][0])
        task = (name, shape, dtype)
        kb.log(f"{name} {format_shape(shape)} {dtype}: tune (compiles every candidate)")
        outcome = kb.run_tune(task, str(out / f"{args.tag}_tuning.jsonl"))
        if outcome is None:
            continue
        kind = "large" if shape in [tuple(s) for s in spec.shapes.get("large", [])] else "other"
        row: dict[str, Any] = {"table": kb.row_for(kind, task, outcome, bw["limit"]), "copy_gbs": bw}
        kb.log(f"  table: {row['table']}")
        try:
            row["search"] = sb.compare(name, shape, dtype, seed=1)
            kb.log(f"  search: {row['search']}")
            picks = []
            for _ in range(2):
                rep = tune_spec(kb.cached_spec(name), shape, dtype, seed=0, strategy="halving").report
                best = next(t for t in rep["trials"] if t["config_key"] == rep["best_config_key"])
                picks.append((rep["best_config_key"], best["median_us"]))
            (k1, m1), (k2, m2) = picks
            row["repeat"] = {"pick1": k1, "us1": m1, "pick2": k2, "us2": m2,
                             "diff": abs(m1 - m2) / min(m1, m2)}
            kb.log(f"  repeat: {row['repeat']}")
        except Exception as e:  # noqa: BLE001 - keep what was measured
            kb.log(f"  FAILED {type(e).__name__}: {str(e)[:300]}")
        results.append(row)
        with open(out / f"{args.tag}_session.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    print(kb.fmt_table([r["table"] for r in results]))
    sb.report([r["search"] for r in results if "search" in r], chip, be, None)
    for r in results:
        if "repeat" in r:
            print(r["table"]["kernel"], r["repeat"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
