"""The GPU benchmarks of the worker core, spread over every GPU of one host.

    bash benchmarks/multi_gpu.sh            # on the GPU host, after `source .mlxcuda/b/setup.sh`
    python benchmarks/session.py --merge DIR  # the combined report from a finished run

On MLX's CUDA backend a custom kernel is compiled by NVRTC the first time it runs (about 1.5 s per
candidate on an H100 host, CPU-bound) and the module lives only in that process: custom kernels are
not in MLX's on-disk PTX cache. The catalog's table shapes need ~1000 such compiles. So the work is
cut into *units* -- one kernel and the shapes that share its compiled code (same template values) --
and each unit runs in its own process:

1. compile: every candidate of the unit is built and launched once on a one-row input (the
   template values do not depend on the row count), in parallel with every other unit, and the
   unit's inputs are generated;
2. pass 1, once every unit of the host has compiled, one unit at a time per GPU (turns by marker
   files, so timings never share a GPU with anything):
   the copy bandwidth, a tune of every table shape (successive halving; kernel-table rows) and,
   for a unit holding the kernel's first large shape, halving vs exhaustive search (the search
   benchmark) and two more tunes (repeatability);
3. pass 2, again one unit at a time per GPU, each with an equal share of the time left: exhaustive
   tunes over more row counts at the same compiled row length (data for benchmarks/predict.py);
4. pass 3, for a run planned from ``--jobs`` (its units hold only those jobs): each job's configs
   timed side by side (``kernels.side_by_side``), e.g. predicted configs against the tuned best of
   held-out shapes (``benchmarks/predict.py --jobs`` writes them, ``--side-by-side`` scores them).

Outputs in --outdir: ``<tag>_<unit>.jsonl`` (one JSON row per table shape, search, repeat and job result)
and ``<tag>_tuning.<unit>.jsonl`` (every tuning report, per-sample lists dropped to keep it small).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"kf_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kb, sb = _load("kernels"), _load("search")

import mlx.core as mx  # noqa: E402

from kernelfleet.chips import detect_chip  # noqa: E402
from kernelfleet.kernels.catalog import NAMES, get_spec  # noqa: E402
from kernelfleet.kernels.render.launch import capture  # noqa: E402
from kernelfleet.kernels.spec import (  # noqa: E402
    KernelSpec,
    Shape,
    config_key,
    format_shape,
    parse_config_key,
    parse_shape,
)
from kernelfleet.worker.backends import detect_backend  # noqa: E402
from kernelfleet.worker.tuner import tune_spec  # noqa: E402

SPREAD_ROWS = (256, 4096, 64, 1024, 16384, 8, 512, 2048, 8192)  # spread out first: a time share may cut it
SPREAD_MAX_ELEMENTS = 1 << 25
TURN_POLL_S = 0.5
# MLX keeps freed buffers in a per-process cache: two dozen processes on one GPU must not hoard them.
# A unit caches up to this much during its turn (so timed launches reuse output buffers) and
# returns everything to the device when its turn ends. KF_TURN_CACHE_GB overrides it.
TURN_CACHE_BYTES = int(float(os.environ.get("KF_TURN_CACHE_GB", "8")) * (1 << 30))
DISTURBED = 0.8


# ----------------------------------------------------------------------------- units


def template_of(spec: KernelSpec, shape: Shape, dtype: str) -> frozenset[tuple[str, str]]:
    """The compiled code ``spec``'s candidates need at ``shape``: every (kernel name, template
    values) their launches use, captured without running anything (on a one-row input: no catalog
    kernel's template depends on the row count)."""
    inputs = spec.make_inputs((1, *shape[1:]), dtype, 0)
    out: set[tuple[str, str]] = set()
    for config in spec.space_for(shape, dtype, "cuda"):
        with capture() as records:
            spec.build(config, "cuda", shape, dtype)(inputs)
        out |= {(r.rendered.name, repr(r.launch.template)) for r in records}
    return frozenset(out)


def units(names: Sequence[str], dtype: str) -> list[dict[str, Any]]:
    """One unit per (kernel, shapes sharing compiled code); cost = candidates to compile."""
    out: list[dict[str, Any]] = []
    for name in names:
        spec = get_spec(name)
        d = dtype if dtype in spec.dtypes else spec.dtypes[-1]
        groups: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
        first_large = tuple(spec.shapes["large"][0]) if spec.shapes.get("large") else None
        for kind in ("decode", "large"):
            for shape in spec.shapes.get(kind, []):
                shape = tuple(shape)
                unit = groups.setdefault(template_of(spec, shape, d), {
                    "kernel": name, "dtype": d, "shapes": [], "kinds": [], "primary": False})
                unit["shapes"].append(format_shape(shape))
                unit["kinds"].append(kind)
                unit["primary"] |= shape == first_large
        for unit in groups.values():
            unit["cost"] = len(spec.space(parse_shape(unit["shapes"][0]), d))
            unit["id"] = f"{name}-{unit['shapes'][0]}"
            out.append(unit)
    return out


def job_units(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Side-by-side jobs (kernel, shape, dtype, configs) as units: one per kernel, dtype and the
    dimensions after the first (no catalog kernel's compiled code depends on the row count)."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for job in jobs:
        trailing = "x".join(job["shape"].split("x")[1:])
        unit = groups.setdefault((job["kernel"], job["dtype"], trailing), {
            "kernel": job["kernel"], "dtype": job["dtype"], "shapes": [], "kinds": [], "primary": False,
            "jobs": [], "id": f"{job['kernel']}-{job['dtype']}-x{trailing}-jobs"})
        unit["jobs"].append(job)
        if job["shape"] not in unit["shapes"]:
            unit["shapes"].append(job["shape"])
            unit["kinds"].append("job")
    for unit in groups.values():
        unit["cost"] = len({c for job in unit["jobs"] for c in job["configs"]})
    return list(groups.values())


def plan(gpus: int, names: Sequence[str], dtype: str, primary_only: bool = False,
         jobs: Sequence[dict[str, Any]] | None = None) -> list[list[dict[str, Any]]]:
    """Units over GPUs, longest compile first onto the least loaded GPU (the compile phase is
    parallel; the timed passes run per GPU in this order). With ``jobs``, only their units."""
    loads = [0.0] * gpus
    per_gpu: list[list[dict[str, Any]]] = [[] for _ in range(gpus)]
    chosen = (job_units(jobs) if jobs is not None
              else [u for u in units(names, dtype) if u["primary"] or not primary_only])
    for unit in sorted(chosen, key=lambda u: (-u["cost"] - 40 * u["primary"], u["id"])):
        g = loads.index(min(loads))
        per_gpu[g].append(unit)
        loads[g] += unit["cost"] + 40 * unit["primary"]  # the search and repeat tunes: ~40 candidates' time
    return per_gpu


# ----------------------------------------------------------------------------- turns


class Turns:
    """Units of one GPU take turns at timing: unit i of pass p waits for unit i-1's marker (the last
    unit of pass p-1 for i = 0). A marker is written even when a unit fails; a waiter also stops
    waiting when its predecessor's process is gone or the deadline passes."""

    def __init__(self, sync: Path, gpu: int, order: int, peers: int, units: int, deadline: float) -> None:
        self.sync, self.gpu, self.order, self.peers, self.deadline = sync, gpu, order, peers, deadline
        self.units = units  # on the whole host
        self.late = False  # the current turn began at the deadline, not after its predecessor
        sync.mkdir(parents=True, exist_ok=True)
        (sync / f"pid.{gpu}.{order}").write_text(str(os.getpid()))

    def _marker(self, p: int, i: int, gpu: int | None = None) -> Path:
        return self.sync / f"pass{p}.{self.gpu if gpu is None else gpu}.{i}.done"

    def _wait_for(self, marker: Path, pid_file: Path) -> None:
        self.late = False
        while not marker.exists():
            if time.time() >= self.deadline:
                self.late = True  # the turn starts anyway, perhaps beside another unit's
                return
            if pid_file.exists() and not _alive(int(pid_file.read_text() or 0)):
                return
            time.sleep(TURN_POLL_S)

    def wait(self, p: int) -> None:
        """Pass 0 is compilation (no turns); pass 1 starts once every unit of the host has compiled:
        a compiling process launches kernels and copies inputs, which would disturb timings."""
        if p == 1 and self.order == 0:
            while len(list(self.sync.glob("pid.*"))) < self.units and time.time() < self.deadline:
                time.sleep(TURN_POLL_S)  # every unit's process has started
            for pid_file in sorted(self.sync.glob("pid.*")):
                gpu, order = (int(x) for x in pid_file.name.split(".")[1:])
                self._wait_for(self._marker(0, order, gpu), pid_file)
        prev = (p, self.order - 1) if self.order > 0 else (p - 1, self.peers - 1)
        if prev[0] < 1:
            return
        self._wait_for(self._marker(*prev), self.sync / f"pid.{self.gpu}.{prev[1]}")

    def done(self, p: int) -> None:
        self._marker(p, self.order).write_text("")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


# ----------------------------------------------------------------------------- one unit


def precompile(spec: KernelSpec, shape: Shape, dtype: str, keys: Sequence[str] | None = None) -> int:
    """Build and launch every candidate (or the configs ``keys``) once on a one-row input: NVRTC
    compiles each here."""
    be = detect_backend()
    small = (1, *shape[1:])
    inputs = spec.make_inputs(small, dtype, 0)
    n = 0
    configs = (be.candidates(spec, shape, dtype) if keys is None else [parse_config_key(k) for k in keys])
    for config in [c for c in configs if config_key(c) != "builtin"]:
        try:
            mx.eval(be.build(spec, config, shape, dtype)(inputs))
            n += 1
        except Exception as e:  # noqa: BLE001 - the tune records it properly
            kb.log(f"  precompile {spec.name} {config}: {type(e).__name__}: {str(e)[:200]}")
    return n


def compact(report: dict[str, Any]) -> dict[str, Any]:
    """The report without per-sample lists and the golden sample (medians and percentiles stay)."""
    out = dict(report)
    out["trials"] = [{k: v for k, v in t.items() if k != "samples_us"} for t in report["trials"]]
    out["golden"] = {k: v for k, v in (report.get("golden") or {}).items() if k != "sample"}
    return out


def spread_shapes(spec: KernelSpec, shapes: Sequence[Shape], dtype: str) -> list[Shape]:
    """More row counts at the unit's compiled row length (shapes of the table excluded)."""
    out = []
    for rows in SPREAD_ROWS:
        shape = (rows, *shapes[0][1:])
        if shape not in shapes and math.prod(shape) <= SPREAD_MAX_ELEMENTS and kb.valid(spec, shape, dtype):
            out.append(shape)
    return out


def table_pass(unit: dict[str, Any], spec: KernelSpec, shapes: Sequence[Shape], emit: Any, tune: Any) -> None:
    """Pass 1: copy bandwidth, the table shapes, and search + repeatability for a primary unit."""
    name, dtype = unit["kernel"], unit["dtype"]
    be = detect_backend()
    bw = kb.copy_bandwidth(be.name, 1 << 30)
    emit("copy", {"copy_gbs": bw})
    for shape, kind in zip(shapes, unit["kinds"], strict=True):
        outcome = tune(shape, "halving")
        if outcome is not None:
            row = kb.row_for(kind, (name, shape, dtype), outcome, bw["limit"])
            emit("table", row)
            kb.log(f"  table: {row}")
    if unit["primary"]:
        shape = tuple(spec.shapes["large"][0])
        result = sb.compare(spec, shape, dtype, seed=0)  # the inputs made before the turn
        emit("search", result)
        kb.log(f"  search: {result}")
        picks = []
        for _ in range(2):
            outcome = tune(shape, "halving")
            if outcome is None:
                break
            rep = outcome.report
            best = next(t for t in rep["trials"] if t["config_key"] == rep["best_config_key"])
            picks.append((rep["best_config_key"], best["median_us"]))
        if len(picks) == 2:
            emit("repeat", repeat_row(spec, shape, dtype, picks))


def model_pass(unit: dict[str, Any], spec: KernelSpec, shapes: Sequence[Shape], emit: Any, tune: Any) -> None:
    """Pass 4 (in pass 1's turn): the model strategy against exhaustive search on the unit's large
    shapes, both over candidates compiled before the turn, and the two picks timed side by side."""
    dtype = unit["dtype"]
    emit("copy", {"copy_gbs": kb.copy_bandwidth(detect_backend().name, 1 << 30)})
    for shape, kind in zip(shapes, unit["kinds"], strict=True):
        if kind != "large":
            continue
        ex, md = tune(shape, "exhaustive"), tune(shape, "model")
        if ex is None or md is None:
            continue
        a, b = ex.report["best_config_key"], md.report["best_config_key"]
        ref = kb.side_by_side(spec, shape, dtype, [a, b]) if a != b else {a: 1.0}
        row = {"kernel": spec.name, "shape": format_shape(shape), "dtype": dtype,
               "candidates": len(ex.report["trials"]), "model_measured": len(md.report["trials"]),
               "ex_best": a, "model_pick": b, "ex_s": ex.total_s, "model_s": md.total_s,
               "side_by_side": ref[b] / ref[a] if ref.get(a) and ref.get(b) else None}
        emit("model_search", row)
        kb.log(f"  model vs exhaustive: {row}")


def repeat_row(spec: KernelSpec, shape: Shape, dtype: str,
               picks: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """Two tunes' picks: their reported medians (measured apart: the machine's drift between the tunes
    counts too) and the two configs timed again side by side (``side``; 0 when both picked the same)."""
    (k1, m1), (k2, m2) = picks
    side = kb.side_by_side_gap(spec, shape, dtype, k1, k2)
    return {"kernel": spec.name, "shape": format_shape(shape), "dtype": dtype, "pick1": k1, "us1": m1,
            "pick2": k2, "us2": m2, "diff": abs(m1 - m2) / min(m1, m2), "side": side}


def run_unit(unit: dict[str, Any], turns: Turns, outdir: Path, tag: str, passes: Sequence[int]) -> None:
    name, dtype = unit["kernel"], unit["dtype"]
    spec = kb.memoize_inputs(get_spec(name), max(16, len(unit["shapes"])))
    rows_out = outdir / f"{tag}_{unit['id']}.jsonl"
    tuning = outdir / f"{tag}_tuning.{unit['id']}.jsonl"

    def emit(kind: str, payload: dict[str, Any]) -> None:
        with open(rows_out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"type": kind, "unit": unit["id"], "gpu": turns.gpu, "late": turns.late,
                                **payload}) + "\n")

    def tune(shape: Shape, strategy: str, seed: int = 0) -> Any:
        try:
            outcome = tune_spec(spec, shape, dtype, strategy=strategy, seed=seed)
        except Exception as e:  # noqa: BLE001 - one failing tune must not stop the unit
            kb.log(f"  {name} {format_shape(shape)}: FAILED {type(e).__name__}: {str(e)[:300]}")
            return None
        with open(tuning, "a", encoding="utf-8") as f:
            f.write(json.dumps(compact(outcome.report), allow_nan=False) + "\n")
        return outcome

    t0 = time.monotonic()
    mx.set_cache_limit(0)
    shapes = [parse_shape(s) for s in unit["shapes"]]
    try:
        jobs = unit.get("jobs", []) if 3 in passes else []
        compiled = precompile(spec, shapes[0], dtype,
                              sorted({c for job in jobs for c in job["configs"]}) if jobs else None)
        spread = spread_shapes(spec, shapes, dtype) if 2 in passes else []
        table = shapes if 1 in passes or 4 in passes or jobs else []
        for shape in [*table, *spread]:  # numpy makes the inputs (seconds for large shapes): before the turn
            mx.eval(spec.make_inputs(shape, dtype, 0))
        kb.log(f"{unit['id']}: compiled {compiled} candidates, inputs ready in {time.monotonic() - t0:.0f} s")
        if 4 in passes:  # the model-vs-exhaustive table shows what compiling the whole space cost
            with open(rows_out, "a", encoding="utf-8") as f:
                f.write(json.dumps({"type": "compile", "unit": unit["id"], "gpu": turns.gpu, "late": False,
                                    "compiled": compiled, "compile_s": time.monotonic() - t0}) + "\n")
    finally:
        turns.done(0)

    turns.wait(1)
    mx.set_cache_limit(TURN_CACHE_BYTES)
    try:
        if 1 in passes:
            table_pass(unit, spec, shapes, emit, tune)
        if 4 in passes:
            model_pass(unit, spec, shapes, emit, tune)
    except Exception as e:  # noqa: BLE001 - keep what was measured
        kb.log(f"  {unit['id']} pass 1 FAILED {type(e).__name__}: {str(e)[:300]}")
    finally:
        end_turn(1, turns)

    turns.wait(2)
    mx.set_cache_limit(TURN_CACHE_BYTES)
    try:
        share = (turns.deadline - time.time()) / max(1, turns.peers - turns.order)
        stop = time.time() + share
        for shape in spread:
            if time.time() > stop:
                kb.log(f"  {unit['id']}: spread stopped at its time share")
                break
            if tune(shape, "exhaustive") is not None:
                emit("spread", {"shape": format_shape(shape)})
    finally:
        end_turn(2, turns)

    turns.wait(3)
    mx.set_cache_limit(TURN_CACHE_BYTES)
    try:
        for job in jobs:
            medians = kb.side_by_side(spec, parse_shape(job["shape"]), dtype, job["configs"])
            emit("side_by_side", {**job, "medians": medians})
    except Exception as e:  # noqa: BLE001 - keep what was measured
        kb.log(f"  {unit['id']} pass 3 FAILED {type(e).__name__}: {str(e)[:300]}")
    finally:
        end_turn(3, turns)


def end_turn(p: int, turns: Turns) -> None:
    kb.log(f"  pass {p} done: peak {mx.get_peak_memory() / 1e9:.1f} GB, "
           f"cache {mx.get_cache_memory() / 1e9:.1f} GB")
    mx.clear_cache()
    mx.set_cache_limit(0)
    turns.done(p)


# ----------------------------------------------------------------------------- merge


def merge(outdir: Path, tag: str) -> str:
    rows: list[dict[str, Any]] = []
    for path in sorted(outdir.glob(f"{tag}_*.jsonl")):
        if ".jsonl" in path.name and "_tuning." not in path.name:
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    order = {n: i for i, n in enumerate(NAMES)}
    shape_order = {(n, format_shape(tuple(s))): i for n in NAMES for i, s in
                   enumerate([*get_spec(n).shapes.get("decode", []), *get_spec(n).shapes.get("large", [])])}
    copies: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["type"] == "copy":
            copies.setdefault(r["gpu"], {})[r["unit"]] = r["copy_gbs"]["limit"]
    # A unit whose copy measurement is far below its GPU's best timed a disturbed GPU (e.g. a turn that
    # started at the deadline, together with others): its rows are shown apart, outside the summary.
    disturbed = {u for g, per in copies.items() for u, v in per.items() if v < DISTURBED * max(per.values())}
    disturbed |= {r["unit"] for r in rows if r.get("late") and r["type"] != "spread"}  # pass 1 started late
    table = sorted((r for r in rows if r["type"] == "table"),
                   key=lambda r: (order[r["kernel"]], shape_order.get((r["kernel"], r["shape"]), 99)))
    for r in table:  # % copy against the GPU's best copy measurement
        limit = max(copies[r["gpu"]].values())
        r["pct_copy"] = 100 * r["tuned_gbs"] / limit
    clean = [r for r in table if r["unit"] not in disturbed]
    searches = sorted((r for r in rows if r["type"] == "search" and r["unit"] not in disturbed),
                      key=lambda r: order[r["kernel"]])
    repeats = sorted((r for r in rows if r["type"] == "repeat" and r["unit"] not in disturbed),
                     key=lambda r: order[r["kernel"]])

    def strip(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("type", "unit", "gpu", "late")} for r in rs]

    lines = ["# copy bandwidth per GPU (GB/s, read + write; measured by each unit before its turn; % copy "
             "uses the GPU's best): "
             + "; ".join(f"GPU {g}: {min(v.values()):.0f}-{max(v.values()):.0f}"
                         for g, v in sorted(copies.items())),
             kb.fmt_table(strip(clean)), "", kb.summary(strip(clean)), ""]
    if disturbed:
        lines += [f"## disturbed units (copy measured below {DISTURBED:.0%} of the GPU's best): "
                  f"{', '.join(sorted(disturbed))}; their rows, outside every figure above and below:",
                  kb.fmt_table(strip([r for r in table if r["unit"] in disturbed])), ""]
    models = [r for r in rows if r["type"] == "model_search" and r["unit"] not in disturbed]
    if models:
        compile_s = {r["unit"]: r["compile_s"] for r in rows if r["type"] == "compile"}
        lines += ["## model strategy vs exhaustive (both over precompiled candidates; compile s = this "
                  "unit's process compiling its whole space, alongside the other units)",
                  model_lines(models, compile_s), ""]
    lines.append("## halving vs exhaustive (each kernel's first large shape; compilation excluded)")
    text = sb.table(searches) if searches else "no search results"
    lines += [text, "", "## repeatability: two halving tunes of the same kernel and shape"]
    lines += repeat_lines(repeats)
    return "\n".join(lines)


def model_lines(rows: Sequence[dict[str, Any]], compile_s: dict[str, float]) -> str:
    out = [f"{'kernel':<14} {'shape':<14} {'cands':>5} {'compile s':>9} {'exh. s':>7} {'model s':>7} "
           f"{'measured':>8} {'pick/best side by side':>22}  exhaustive best / model pick"]
    for r in rows:
        side = f"{r['side_by_side']:.3f}" if r["side_by_side"] is not None else "failed"
        out.append(f"{r['kernel']:<14} {r['shape']:<14} {r['candidates']:>5} "
                   f"{compile_s.get(r['unit'], 0):>9.1f} "
                   f"{r['ex_s']:>7.1f} {r['model_s']:>7.1f} {r['model_measured']:>8} {side:>22}  "
                   f"{r['ex_best']} / {r['model_pick']}")
    sides = [r["side_by_side"] for r in rows if r["side_by_side"] is not None]
    if sides:
        within = sum(x <= 1.03 for x in sides)
        out.append(f"model pick within 3% of exhaustive's best (side by side): {within}/{len(sides)}; "
                   f"worst {max(sides):.3f}")
    return "\n".join(out)


def repeat_lines(repeats: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for r in repeats:
        side = r.get("side")
        tail = f"side by side {100 * side:.2f}%" if side is not None else "side by side failed"
        tail = tail if "side" in r else ""
        lines.append(f"{r['kernel']:<20} {r['shape']:<12} {r['pick1']:<24} {r['us1']:>9.2f} µs  "
                     f"{r['pick2']:<24} {r['us2']:>9.2f} µs  "
                     f"reported medians differ {100 * r['diff']:5.2f}%, {tail}")
    if repeats:
        ok = sum(r["diff"] <= 0.03 for r in repeats)
        worst = 100 * max(r["diff"] for r in repeats)
        lines.append(f"picks within 3%, reported medians: {ok}/{len(repeats)}; worst {worst:.2f}%")
        sides = [r["side"] for r in repeats if r.get("side") is not None]
        if sides:
            lines.append(f"picks within 3%, side by side: {sum(d <= 0.03 for d in sides)}/{len(sides)}; "
                         f"worst {100 * max(sides):.2f}%")
    return lines


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=int, metavar="GPUS", help="print the unit plan as JSON lines")
    ap.add_argument("--primary-only", action="store_true",
                    help="plan only the units holding a kernel's first large shape (search and repeat)")
    ap.add_argument("--unit", help="run this unit (one JSON object from --plan)")
    ap.add_argument("--merge", type=Path, metavar="DIR", help="print the combined report of DIR")
    ap.add_argument("--kernels", default=",".join(NAMES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--outdir", type=Path, default=Path("."))
    ap.add_argument("--tag", default="gpu")
    ap.add_argument("--deadline", type=float, help="epoch seconds by which every pass must end")
    ap.add_argument("--passes", default="1,2",
                    help="which timed passes to run (1: table, search, repeat; 2: spread; 3: --jobs; "
                         "4: the model strategy vs exhaustive, in pass 1's turn)")
    ap.add_argument("--jobs", type=Path, help="with --plan: units for these side-by-side jobs only (JSON "
                    "lines {kernel, shape, dtype, configs}, e.g. from benchmarks/predict.py --jobs); pass 3 "
                    "times them")
    args = ap.parse_args(argv)
    if args.plan:
        jobs = ([json.loads(line) for line in args.jobs.read_text().splitlines() if line.strip()]
                if args.jobs else None)
        per_gpu = plan(args.plan, args.kernels.split(","), args.dtype, args.primary_only, jobs)
        total = sum(len(u) for u in per_gpu)
        for g, gpu_units in enumerate(per_gpu):
            for i, unit in enumerate(gpu_units):
                print(json.dumps({"gpu": g, "order": i, "peers": len(gpu_units), "units": total, **unit}))
        return 0
    if args.merge:
        print(merge(args.merge, args.tag))
        return 0
    if not args.unit:
        ap.error("give --plan, --unit or --merge")
    unit = json.loads(args.unit)
    args.outdir.mkdir(parents=True, exist_ok=True)
    turns = Turns(args.outdir / "turns", unit["gpu"], unit["order"], unit["peers"], unit["units"],
                  args.deadline or time.time() + 500)
    kb.log(f"{detect_chip().name}: unit {unit['id']} "
           f"({unit['order'] + 1}/{unit['peers']} on GPU {unit['gpu']})")
    run_unit(unit, turns, args.outdir, args.tag, [int(p) for p in args.passes.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
