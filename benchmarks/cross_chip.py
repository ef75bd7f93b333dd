"""Cross-chip prediction, on the GPU: a profile for one GPU kind built from the other kind's reports
only, scored side by side against configs tuned on that GPU in the same run (issue 12).

    python benchmarks/cross_chip.py plan --target h200 --out results/h200_transfer_run_jobs.jsonl  # CPU
    # on the GPU host, after `source .mlxcuda/b/setup.sh`, with kernels/ and worker/ copied to
    # /tmp/kf/kernelfleet and PYTHONPATH=/tmp/kf:$PYTHONPATH (as benchmarks/multi_gpu.sh does); a few
    # kernels per call (NVRTC compiles every unit's candidates in parallel first, cold: 2-4 kernels,
    # 3-8 minutes on an H100, 3-6 on an H200; 6 kernels did not get past compiling in 8; a warm PTX
    # cache on the same machine: seconds). The call's limit must exceed --budget + 60 s: the results
    # are gathered at the end. --kept-only times only the entries the profile keeps:
    python3 benchmarks/cross_chip.py run --jobs benchmarks/results/h200_transfer_run_jobs.jsonl \
        --outdir $OUT --tag h200_transfer_run --kernels rope,topk_gating_softmax [--kept-only]
    # anywhere: one result file per run (the first is tabled; a run's calls appended into one file)
    python benchmarks/cross_chip.py score --jobs results/h200_transfer_run_jobs.jsonl \
        results/h200_transfer_run.jsonl results/h200_transfer_run2.jsonl --out results/h200_transfer_run.txt

**plan** (needs the coordinator's packages: SQLAlchemy, pydantic) loads the committed reports of both
GPUs (``benchmarks/results/*_tuning.jsonl``) into temporary SQLite databases through the service's own
code (``db upgrade``, ``reports.store_report`` with the import route's digest de-duplication), and,
**leaving one kernel out**, for each kernel K: deletes the target chip's stats of K, calibrates
(``profile_builder.calibrate``) and builds the target chip's profile (``profiles.build_body(...,
threshold=0.8, allow_predicted=True)``), keeping K's entries. So every entry is predicted from the
source chip's results alone (a *transfer* where the source measured the very shape: its measured
pick), and its confidence is calibrated on held-out predictions that never saw the target's K: among
them the transfers between the two chips on the other kernels (the target's earlier tunes). With no
target result at all (``cold``), there is no transfer to calibrate on and every entry falls back: the
count is in the meta line. It also builds the body at threshold 0 (the predictor's picks without the
confidence gate; the speedup gate stays) and takes the source chip's own measured entry at the same
shape. Entries: the catalog's standard bfloat16 shapes (decode and large) of every kernel, 48
(kernel, shape) pairs: the shapes users call, and a set that one GPU session can tune in full. One
job line per entry; the first line holds the meta (the folds' calibration bins).

**run** (GPU) tunes every job's shape on this GPU (successive halving, the worker's tuner; the
built-in is a candidate), then times side by side, in the same process, interleaved round by round
(``worker.measure.Measurer``, as ``kernels.side_by_side`` does, keeping the samples): the tuned best,
the profile's entry, the ungated pick, the source chip's own entry and the built-in. NVRTC compiles
each custom candidate once per process (~1.5 s), so the work is cut into units that share compiled
code (``session.units``), one process per unit: all compile in parallel, then the units take turns
on the GPU one at a time (``session.Turns``). A unit whose turn starts only at the deadline (beside
others) times nothing and says so. Output: ``TAG.jsonl`` (appended: a run cut into several calls is
one file) and the tunes as reports, ``TAG_tuning.jsonl`` (a later plan's data).

**score** compares each entry with the tuned best's median from the same side-by-side rounds:
within 5 % or not; and with the built-in: *slower beyond the noise* when its median is more than
3 % above the built-in's (the floor: repeat pairs side by side differed by up to 1.9 % in
``h100_session_run6.txt``) and the paired bootstrap's 95 % interval of that ratio (rounds resampled:
both configs ran in every round) lies above 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
CHIPS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
THRESHOLD = 0.8
TOLERANCE = 0.05
NOISE_FLOOR = 0.03
DTYPE = "bfloat16"
REFEREE_ROUNDS = 200
BOOTSTRAP = 2000


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"kf_bench_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- plan (CPU)


def source_files(results: Path = RESULTS) -> list[Path]:
    """Every committed tuning report file (the benchmark's own earlier runs included: a target chip's
    earlier tunes of *other* kernels are what its confidence is calibrated on)."""
    return sorted(results.glob("*_tuning.jsonl"))


def catalog_entries() -> list[tuple[str, str]]:
    """(kernel, shape) for every kernel's standard decode and large shapes, in catalog order."""
    from kernelfleet.kernels.catalog import NAMES, get_spec
    from kernelfleet.kernels.spec import format_shape

    return [(name, format_shape(tuple(s))) for name in NAMES for kind in ("decode", "large")
            for s in get_spec(name).shapes.get(kind, [])]


def build_profiles(source: str, target: str, files: Sequence[Path], kernels: Sequence[str]) -> dict[str, Any]:
    """The target chip's entries (threshold 0.8 and 0) of each of ``kernels`` from the source chip's
    reports only, and the source chip's own profile, built by the service's code on temporary SQLite
    databases. Leave one kernel out: for kernel K, the database holds every source report and the
    target's earlier reports of the other kernels, so K's entries are predicted from the source alone
    while the calibration (``profile_builder.calibrate``: held-out predictions, transfers between the
    two chips among them) never sees the target's K. ``cold``: the same with no target report at all."""
    import shutil

    from sqlalchemy import delete

    from kernelfleet.service import profile_builder, profiles
    from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
    from kernelfleet.service.migrate import upgrade
    from kernelfleet.service.models import ConfigStat
    from kernelfleet.service.reports import store_report
    from kernelfleet.service.schemas import TuningReport
    from kernelfleet.service.settings import Settings

    def bodies(name: str, drop: Any, with_source: bool = False) -> tuple[Any, Any, Any, Any]:
        """(calibration, gated body, ungated body, source body or None) on a copy of the base database
        with ``drop``'s stats rows deleted."""
        url = f"sqlite:///{tmp}/{name}.db"
        shutil.copy(base, url.removeprefix("sqlite:///"))
        engine = make_engine(url)
        factory = make_sessionmaker(engine)
        with factory() as session, immediate(session):
            session.execute(delete(ConfigStat).where(drop))
        cal = profile_builder.calibrate(factory, "cuda", Settings(database_url=url))
        with factory() as session:
            out = (cal, profiles.build_body(session, target, None, threshold=THRESHOLD, allow_predicted=True),
                   profiles.build_body(session, target, None, threshold=0.0, allow_predicted=True),
                   profiles.build_body(session, source, None, threshold=THRESHOLD) if with_source else None)
        engine.dispose()
        return out

    def bins(cal: Any) -> dict[str, Any]:
        return {"samples": cal.samples if cal else 0, "bins": list(cal.bins) if cal else []}

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.db"
        upgrade(f"sqlite:///{base}")
        engine = make_engine(f"sqlite:///{base}")
        factory = make_sessionmaker(engine)
        stored: dict[str, int] = {}
        duplicates, other = 0, 0
        per_file: dict[str, int] = {}
        digests: set[str] = set()
        with factory() as session, immediate(session):
            for path in files:
                for line in path.read_text(encoding="utf-8").splitlines():
                    if not line.strip():
                        continue
                    data = json.loads(line)
                    chip = data["env"]["chip"]
                    if chip not in (source, target):
                        other += 1
                        continue
                    report = TuningReport.model_validate(data)
                    digest = report.digest()
                    if digest in digests:  # the import route's rule: one report, one run
                        duplicates += 1
                        continue
                    digests.add(digest)
                    store_report(session, report, source="import")
                    stored[chip] = stored.get(chip, 0) + 1
                    per_file[path.name] = per_file.get(path.name, 0) + 1
        engine.dispose()
        gated: list[dict[str, Any]] = []
        ungated: list[dict[str, Any]] = []
        folds: dict[str, Any] = {}
        for kernel in kernels:
            drop = (ConfigStat.chip == target) & (ConfigStat.kernel == kernel)
            cal, g, u, _ = bodies(f"fold_{kernel}", drop)
            folds[kernel] = bins(cal)
            for body, into in ((g, gated), (u, ungated)):
                into += [e for e in (body or {}).get("entries", [])
                         if e["kernel"] == kernel and e["predicted"]]
        # the source's measured entries do not depend on the target's data: built once, here
        cal, g, u, own = bodies("cold", ConfigStat.chip == target, with_source=True)
        cold = {"calibration": bins(cal), "counts": (g or {}).get("counts"),
                "ungated_counts": (u or {}).get("counts")}
    return {"stored": stored, "duplicates": duplicates, "other_chips": other, "per_file": per_file,
            "folds": folds, "cold": cold, "gated": {"entries": gated}, "ungated": {"entries": ungated},
            "own": own}


def plan_jobs(built: dict[str, Any], entries: Sequence[tuple[str, str]], dtype: str = DTYPE
              ) -> list[dict[str, Any]]:
    """One job per (kernel, shape): the profile entry, the ungated pick, the source's own entry and
    the configs to time beside the tuned best."""
    def index(body: dict[str, Any] | None) -> dict[tuple[str, str, str], dict[str, Any]]:
        return {(e["kernel"], e["shape"], e["dtype"]): e for e in (body or {}).get("entries", [])}

    gated, ungated, own = index(built["gated"]), index(built["ungated"]), index(built["own"])
    jobs = []
    for kernel, shape in entries:
        key = (kernel, shape, dtype)
        g, u, o = gated.get(key), ungated.get(key), own.get(key)
        job: dict[str, Any] = {"type": "job", "kernel": kernel, "shape": shape, "dtype": dtype}
        if g is None:  # no prediction possible: the runtime would run the kernel's default config
            job.update(profile_key=None, fallback=None, no_entry=True,
                       default_key=_default_key(kernel, shape))
        else:
            job.update(profile_key=g["config_key"], fallback=g.get("fallback"), confidence=g["confidence"],
                       score=g["score"], raw_pick=g.get("predicted_config_key", g["config_key"]),
                       predicted_speedup=(u or {}).get("speedup"), basis=g.get("basis"))
        job["ungated_key"] = u["config_key"] if u else None
        job["ungated_fallback"] = (u or {}).get("fallback")
        job["source_key"] = o["config_key"] if o and not o.get("predicted") else None
        keys = [job.get("profile_key") or job.get("default_key"), job.get("raw_pick"), job["ungated_key"],
                job["source_key"], "builtin"]
        job["configs"] = list(dict.fromkeys(k for k in keys if k))
        jobs.append(job)
    return jobs


def _default_key(kernel: str, shape: str) -> str | None:
    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.spec import config_key, parse_shape

    try:
        return config_key(get_spec(kernel).default_config(parse_shape(shape), DTYPE))
    except Exception:  # noqa: BLE001 - no default for this shape
        return None


def plan(target: str, out: Path, results: Path = RESULTS) -> int:
    from kernelfleet.service.profiles import counts

    target_chip = CHIPS[target]
    source = next(k for k in CHIPS if k != target)
    files = source_files(results)
    entries = catalog_entries()
    built = build_profiles(CHIPS[source], target_chip, files, list(dict.fromkeys(k for k, _ in entries)))
    jobs = plan_jobs(built, entries)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "service"], capture_output=True, text=True,
                           cwd=Path(__file__).parent).stdout.strip()
    meta = {"type": "meta", "target": target_chip, "source": CHIPS[source], "threshold": THRESHOLD,
            "files": [p.name for p in files], "stored": built["stored"], "duplicates": built["duplicates"],
            "per_file": built["per_file"], "folds": built["folds"], "cold": built["cold"],
            "counts": counts(built["gated"]), "ungated_counts": counts(built["ungated"]),
            "service_commit": commit + (" (service/ had uncommitted changes)" if dirty else ""),
            "planned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(x) + "\n" for x in [meta, *jobs]))
    fell = sum(1 for j in jobs if j.get("fallback"))
    log(f"{target_chip} from {built['stored'].get(CHIPS[source], 0)} {CHIPS[source]} reports (calibrated "
        f"with {built['stored'].get(target_chip, 0)} earlier {target_chip} reports of the other kernels): "
        f"{len(jobs)} entries, {fell} fall back to the built-in; with no {target_chip} report at all: "
        f"{built['cold']['counts']} -> {out}")
    return 0


def kept(job: dict[str, Any]) -> bool:
    """The profile keeps a custom config here (not the built-in by prediction, gate or absence)."""
    return bool(job.get("profile_key")) and job["profile_key"] != "builtin" and not job.get("fallback")


def read_jobs(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    meta = next((r for r in rows if r.get("type") == "meta"), {})
    return meta, [r for r in rows if r.get("type") == "job"]


# ----------------------------------------------------------------------------- run (GPU)


def referee(kb: Any, spec: Any, shape: tuple[int, ...], dtype: str, keys: Sequence[str], rounds: int,
            seed: int = 0) -> dict[str, dict[str, Any]]:
    """``keys`` timed side by side (``kernels.side_by_side_measured``: one Measurer, interleaved
    shuffled rounds, each checked against the reference first): per key its median, p10, p90, the
    per-round samples and its launches per round."""
    keys = list(dict.fromkeys(keys))
    measurer, _ = kb.side_by_side_measured(spec, shape, dtype, keys, rounds, seed)
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        trial = measurer.trials[key]
        stats = trial.to_report()
        out[key] = {"status": trial.status, "error": (trial.error or "")[:300] or None,
                    **{k: stats[k] for k in ("median_us", "p10_us", "p90_us", "n")},
                    "launches_per_round": trial.launches_per_round, "calibration_us": trial.calibration_us,
                    "samples_us": [round(s, 3) for s in measurer.samples(key)]}
    return out


def run_unit(unit: dict[str, Any], sync: Path, outdir: Path, rounds: int, deadline: float) -> None:
    import mlx.core as mx

    from kernelfleet.chips import detect_chip
    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.spec import parse_shape
    from kernelfleet.worker.tuner import tune_spec

    session, kb = _load("session"), _load("kernels")
    turns = session.Turns(sync, 0, unit["order"], unit["peers"], unit["peers"], deadline)
    name, dtype = unit["kernel"], unit["dtype"]
    chip = detect_chip().name
    spec = kb.memoize_inputs(get_spec(name), max(8, len(unit["jobs"])))
    rows_out = outdir / f"rows.{unit['id']}.jsonl"
    tuning_out = outdir / f"tuning.{unit['id']}.jsonl"

    def emit(payload: dict[str, Any]) -> None:
        with open(rows_out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"type": "result", "unit": unit["id"], "chip": chip, "late": turns.late,
                                **payload}, allow_nan=False) + "\n")

    t0 = time.monotonic()
    mx.set_cache_limit(0)
    shapes = [parse_shape(j["shape"]) for j in unit["jobs"]]
    try:
        compiled = session.precompile(spec, shapes[0], dtype)
        for shape in shapes:
            mx.eval(spec.make_inputs(shape, dtype, 0))
        log(f"{unit['id']}: compiled {compiled} candidates, inputs ready in {time.monotonic() - t0:.0f} s")
    finally:
        turns.done(0)
    turns.wait(1)
    mx.set_cache_limit(session.TURN_CACHE_BYTES)
    try:
        for job, shape in zip(unit["jobs"], shapes, strict=True):
            base = {k: job[k] for k in ("kernel", "shape", "dtype")}
            if turns.late or time.time() > deadline:
                emit({**base, "skipped": "the unit's turn came at the deadline: not timed alone on the GPU"})
                continue
            t1 = time.monotonic()
            try:
                outcome = tune_spec(spec, shape, dtype, strategy="halving", seed=0)
            except Exception as e:  # noqa: BLE001 - one failing tune must not stop the unit
                emit({**base, "skipped": f"tune failed: {type(e).__name__}: {str(e)[:300]}"})
                continue
            with open(tuning_out, "a", encoding="utf-8") as f:
                f.write(json.dumps(session.compact(outcome.report), allow_nan=False) + "\n")
            best = outcome.report["best_config_key"]
            tuned = {t["config_key"]: t["median_us"] for t in outcome.report["trials"]
                     if t["status"] == "ok" and t["median_us"]}
            t2 = time.monotonic()
            timed = referee(kb, spec, shape, dtype, [best, *job["configs"]], rounds)
            emit({**base, "tuned_best": best,
                  "tune_medians": {k: tuned.get(k) for k in [best, *job["configs"]]},
                  "candidates": len(outcome.report["trials"]), "tune_s": round(t2 - t1, 2),
                  "referee_s": round(time.monotonic() - t2, 2), "rounds": rounds, "timed": timed})
            log(f"  {name} {job['shape']}: tuned {best} "
                + ", ".join(f"{k} {v['median_us']:.2f}" if v["median_us"] else f"{k} {v['status']}"
                            for k, v in timed.items()))
    except Exception as e:  # noqa: BLE001 - keep what was measured
        log(f"  {unit['id']} FAILED {type(e).__name__}: {str(e)[:300]}")
    finally:
        session.end_turn(1, turns)


def gpu_units(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs grouped into units of shared compiled code (``session.units``), longest compile first."""
    session = _load("session")
    by_key = {(j["kernel"], j["shape"]): j for j in jobs}
    kernels = list(dict.fromkeys(j["kernel"] for j in jobs))
    out = []
    for unit in session.units(kernels, DTYPE):
        mine = [by_key[(unit["kernel"], s)] for s in unit["shapes"] if (unit["kernel"], s) in by_key]
        if mine:
            out.append({"kernel": unit["kernel"], "dtype": unit["dtype"], "id": unit["id"],
                        "cost": unit["cost"], "jobs": mine})
    out.sort(key=lambda u: (-u["cost"], u["id"]))
    for i, unit in enumerate(out):
        unit.update(order=i, peers=len(out))
    return out


def run(jobs_path: Path, outdir: Path, kernels: Sequence[str] | None, budget: float, rounds: int,
        tag: str, kept_only: bool = False) -> int:
    from kernelfleet.chips import detect_chip

    meta, jobs = read_jobs(jobs_path)
    chip = detect_chip().name
    if meta.get("target") and meta["target"] != chip:
        log(f"these jobs are for {meta['target']}, this GPU is {chip}: plan for this GPU first")
        return 2
    if kernels:
        jobs = [j for j in jobs if j["kernel"] in kernels]
    if kept_only:  # the entries the targets are about; a fallback is the built-in by construction
        jobs = [j for j in jobs if kept(j)]
    units = gpu_units(jobs)
    deadline = time.time() + budget
    work = Path(tempfile.mkdtemp(prefix="kf_cross_chip_"))
    outdir.mkdir(parents=True, exist_ok=True)
    log(f"{chip}: {len(jobs)} entries in {len(units)} units; timed turns end by "
        f"{time.strftime('%H:%M:%S', time.localtime(deadline))}")
    procs = []
    with open(outdir / f"log_{tag}.txt", "a", encoding="utf-8") as logf:
        for unit in units:
            cmd = [sys.executable, __file__, "unit", "--unit", json.dumps(unit), "--outdir", str(work),
                   "--rounds", str(rounds), "--deadline", str(deadline)]
            procs.append(subprocess.Popen(cmd, stderr=logf, stdout=logf))
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline + 60 - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
    rows = [line for f in sorted(work.glob("rows.*.jsonl")) for line in f.read_text().splitlines()
            if line.strip()]
    tuning = [line for f in sorted(work.glob("tuning.*.jsonl")) for line in f.read_text().splitlines()
              if line.strip()]
    with open(outdir / f"{tag}.jsonl", "a", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in rows))
    with open(outdir / f"{tag}_tuning.jsonl", "a", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in tuning))
    timed = sum(1 for r in rows if "timed" in json.loads(r))
    log(f"{timed} of {len(jobs)} entries timed -> {outdir}")
    return 0


# ----------------------------------------------------------------------------- score (anywhere)


def paired_ratio_interval(a: Sequence[float], b: Sequence[float], n: int = BOOTSTRAP,
                          seed: int = 0) -> tuple[float, float]:
    """95 % interval of median(a) / median(b), resampling rounds (sample i of a and b share round i)."""
    import numpy as np

    m = min(len(a), len(b))
    x, y = np.asarray(a[:m]), np.asarray(b[:m])
    idx = np.random.default_rng(seed).integers(0, m, size=(n, m))
    ratios = np.median(x[idx], axis=1) / np.median(y[idx], axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def score_entry(job: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any]:
    """One entry's figures: the profile's config against the tuned best and the built-in (same rounds)."""
    row: dict[str, Any] = {k: job.get(k) for k in ("kernel", "shape", "dtype", "fallback", "no_entry",
                                                      "confidence", "score", "raw_pick", "ungated_key",
                                                      "source_key")}
    entry = job.get("profile_key") or job.get("default_key")
    row["entry"] = entry
    row["kind"] = shape_kind(job["kernel"], job["shape"])
    if result is None or "timed" not in result:
        row["skipped"] = (result or {}).get("skipped", "not run")
        return row
    timed, best = result["timed"], result["tuned_best"]
    med = {k: v["median_us"] for k, v in timed.items()}
    row.update(tuned_best=best, tuned_us=med.get(best), builtin_us=med.get("builtin"),
               entry_us=med.get(entry), chip=result["chip"])

    def ratio(key: str | None) -> float | None:
        if not key or not med.get(key) or not med.get(best):
            return None
        return 1.0 if key == best else med[key] / med[best]

    row["ratio"] = ratio(entry)
    row["within"] = row["ratio"] is not None and row["ratio"] <= 1 + TOLERANCE
    row["ungated_ratio"] = ratio(job.get("ungated_key"))
    row["raw_ratio"] = ratio(job.get("raw_pick"))
    row["source_ratio"] = ratio(job.get("source_key"))
    row["builtin_ratio"] = ratio("builtin")
    row["best_timed"] = min((k for k in med if med[k]), key=lambda k: med[k])
    for name, key in (("", entry), ("ungated_", job.get("ungated_key"))):
        row[name + "vs_builtin"], row[name + "slower"] = None, False
        if key and key != "builtin" and med.get(key) and med.get("builtin"):
            r = med[key] / med["builtin"]
            lo, hi = paired_ratio_interval(timed[key]["samples_us"], timed["builtin"]["samples_us"])
            row[name + "vs_builtin"] = (r, lo, hi)
            row[name + "slower"] = r > 1 + NOISE_FLOOR and lo > 1.0
        elif key == "builtin":
            row[name + "vs_builtin"] = (1.0, 1.0, 1.0)
    return row


def shape_kind(kernel: str, shape: str) -> str:
    """``decode`` or ``large``: which of the catalog's shape lists holds ``shape`` (else ``other``)."""
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import format_shape

        shapes = get_spec(kernel).shapes
    except Exception:  # noqa: BLE001 - a kernel this catalog does not know
        return "other"
    return next((k for k, v in shapes.items() if shape in {format_shape(tuple(x)) for x in v}), "other")


def _hit(ratio: float | None) -> bool:
    """Within the tolerance of the tuned best (a config that failed to run is a miss)."""
    return ratio is not None and ratio <= 1 + TOLERANCE


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} = {k / n:.1%}" if n else f"{k}/0"


def load_run(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """One run's result rows by (kernel, shape, dtype); a timed row wins over a skipped one."""
    results: dict[tuple[str, str, str], dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            key = (r["kernel"], r["shape"], r["dtype"])
            if "timed" in r or key not in results:
                results[key] = r
    return results


def score(jobs_path: Path, result_paths: Sequence[Path], out: Path | None, note: str | None = None) -> str:
    """The table (first run) and a summary per run (each file one run: tuned and timed anew); ``note``:
    a line under the title (say, that the runs predate the plan)."""
    meta, jobs = read_jobs(jobs_path)
    runs = [load_run(p) for p in result_paths]
    per_run = [[score_entry(j, res.get((j["kernel"], j["shape"], j["dtype"]))) for j in jobs] for res in runs]
    rows = per_run[0]
    devices = sorted({r["chip"] for rs in per_run for r in rs if "skipped" not in r})

    def fmt(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    head = (f"{'kernel':<20} {'shape':<13} {'profile entry':<22} {'conf':>5} {'tuned best':<22} "
            f"{'tuned µs':>9} {'entry µs':>9} {'built-in µs':>11} {'ratio':>6} {'≤5%':>4} {'vs built-in':>22}"
            f"  {'ungated pick':<22} {'ratio':>6}  {'source entry':<22} {'ratio':>6}")
    lines = [
        "Cross-chip prediction, on the GPU (benchmarks/cross_chip.py; issue 12)",
        *([f"note: {note}"] if note else []),
        f"target: {meta.get('target')}   source: {meta.get('source')} reports only, for each kernel's "
        f"entries ({_stored(meta)}, {meta.get('duplicates')} duplicates skipped, from "
        f"{', '.join(f'{k} {v}' for k, v in sorted((meta.get('per_file') or {}).items()))})",
        "leave one kernel out: a kernel's entries are built with none of the target's results for it; "
        "the target's earlier results of the other kernels calibrate the confidence",
        f"device that ran it: {', '.join(devices) or 'none'} (every figure below; the name MLX's chip "
        f"detection reports); service at {meta.get('service_commit')}, planned {meta.get('planned_at')}",
        f"profile: profiles.build_body(threshold={meta.get('threshold')}, allow_predicted=True): "
        f"{meta.get('counts')}; ungated (threshold 0): {meta.get('ungated_counts')}",
        f"entries: the catalog's standard {DTYPE} shapes (decode + large) of every kernel: {len(jobs)}; "
        f"runs: {len(runs)} ({', '.join(p.name for p in result_paths)}), each tuning every shape anew",
        f"score: medians of one side-by-side measurement ({_rounds(runs[0])} interleaved rounds of >= 4 ms) "
        "of the tuned best (halving on this GPU, built-in included), the profile entry, the ungated pick, "
        "the source chip's own entry and the built-in; ratio = entry / tuned best; slower than the built-in "
        f"beyond the noise = median > {1 + NOISE_FLOOR:.2f}x the built-in's and the paired bootstrap 95 % "
        "interval of that ratio above 1",
        "",
        f"run 1 ({result_paths[0].name}); conf = the entry's calibrated confidence; built-in (conf): the "
        f"confidence is below {meta.get('threshold')}; built-in (predicted): the predictor picks the "
        "built-in; built-in (no gain): not predicted faster than the built-in",
        head, "-" * len(head),
    ]
    for r in rows:
        entry = (f"built-in ({_short(r['fallback'])})" if r.get("fallback")
                 else f"{r['entry']} (default)" if r.get("no_entry") else r["entry"])
        if "skipped" in r:
            lines.append(f"{r['kernel']:<20} {r['shape']:<13} {entry:<22} {fmt(r['confidence']):>5}  "
                         f"not timed: {r['skipped']}")
            continue
        vb = r["vs_builtin"]
        vb_s = "-" if vb is None else f"{vb[0]:.3f} [{vb[1]:.3f}, {vb[2]:.3f}]"
        vb_s += " SLOWER" if r["slower"] else ""
        lines.append(
            f"{r['kernel']:<20} {r['shape']:<13} {entry:<22} {fmt(r['confidence']):>5} {r['tuned_best']:<22} "
            f"{fmt(r['tuned_us']):>9} {fmt(r['entry_us']):>9} {fmt(r['builtin_us']):>11} "
            f"{fmt(r['ratio'], '.3f'):>6} {'yes' if r['within'] else 'NO':>4} {vb_s:>22}  "
            f"{r['ungated_key'] or '-':<22} {fmt(r['ungated_ratio'], '.3f'):>6}  "
            f"{r['source_key'] or '-':<22} {fmt(r['source_ratio'], '.3f'):>6}")
    for i, (path, rs) in enumerate(zip(result_paths, per_run, strict=True), start=1):
        lines += ["", *summary_lines(rs, meta, f"run {i}, {path.name}")]
    if len(per_run) > 1:
        lines += ["", *agreement_lines(per_run)]
    lines += ["", *calibration_lines(meta)]
    text = "\n".join(lines) + "\n"
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    return text


def _short(reason: str) -> str:
    if "below" in reason:
        return "conf"
    if "built-in is predicted" in reason:
        return "predicted"
    if "not predicted faster" in reason:
        return "no gain"
    return "no entry"


def _rounds(results: dict[Any, dict[str, Any]]) -> str:
    rounds = sorted({r.get("rounds") for r in results.values() if r.get("rounds")})
    return "/".join(str(x) for x in rounds) or "?"


def summary_lines(rows: Sequence[dict[str, Any]], meta: dict[str, Any], label: str = "") -> list[str]:
    timed = [r for r in rows if "skipped" not in r]
    custom = [r for r in timed if not r.get("fallback") and not r.get("no_entry")]
    absent = [r for r in rows if r.get("no_entry")]
    fell = [r for r in rows if r.get("fallback")]
    slower = [r for r in timed if r["slower"]]
    devices = ", ".join(sorted({r["chip"] for r in timed})) or "none"
    lines = [
        f"summary{' of ' + label if label else ''} (device: {devices}; source: {meta.get('source')} "
        "reports only)",
        f"  entries: {len(rows)} planned, {len(timed)} timed",
        f"  fell back to the built-in: {_pct(len(fell), len(rows))}"
        + (f"; no entry at all (no source; the runtime runs the kernel default): {len(absent)}"
           if absent else ""),
        f"  non-fallback entries within {TOLERANCE:.0%} of the tuned best: "
        f"{_pct(sum(r['within'] for r in custom), len(custom))}  (target >= 90%)",
        f"  all entries (fallbacks = the built-in) within {TOLERANCE:.0%} of the tuned best: "
        f"{_pct(sum(r['within'] for r in timed), len(timed))}",
        f"  entries slower than the built-in beyond the noise: {len(slower)}  (target 0)"
        + (": " + "; ".join(f"{r['kernel']} {r['shape']} {r['vs_builtin'][0]:.3f}x" for r in slower)
           if slower else ""),
    ]
    ungated = [r for r in timed if r.get("ungated_key") and r["ungated_key"] != "builtin"]
    if ungated:
        hits = sum(_hit(r["ungated_ratio"]) for r in ungated)
        slow = [r for r in ungated if r["ungated_slower"]]
        by_kind = {k: [r for r in ungated if r["kind"] == k] for k in ("decode", "large")}
        kinds = ", ".join(f"{k} {_pct(sum(_hit(r['ungated_ratio']) for r in sub), len(sub))}"
                          for k, sub in by_kind.items() if sub)
        lines += [
            "  without the confidence gate (threshold 0; the predicted-speedup gate stays): "
            f"{len(ungated)} custom entries, {_pct(hits, len(ungated))} within {TOLERANCE:.0%} ({kinds}), "
            f"{len(slow)} slower than the built-in beyond the noise"
            + (": " + "; ".join(f"{r['kernel']} {r['shape']} {r['ungated_vs_builtin'][0]:.3f}x" for r in slow)
               if slow else ""),
        ]
    raw = [r for r in timed if r.get("raw_pick")]
    if raw:  # a pick that failed to run counts as a miss
        hits = sum(_hit(r["raw_ratio"]) for r in raw)
        lines.append(f"  the predictor's raw pick (before every gate): {_pct(hits, len(raw))} within "
                     f"{TOLERANCE:.0%}")
    src = [r for r in timed if r.get("source_key")]
    if src:
        hits = sum(_hit(r["source_ratio"]) for r in src)
        lines.append(f"  the source chip's own measured entry at the same shape: {_pct(hits, len(src))} "
                     f"within {TOLERANCE:.0%}")
    bi = [r for r in timed if r.get("builtin_ratio") is not None]
    if bi:
        hits = sum(1 for r in bi if r["builtin_ratio"] <= 1 + TOLERANCE)
        lines.append(f"  the built-in alone: {_pct(hits, len(bi))} within {TOLERANCE:.0%}")
    misses = [r for r in ungated if r["ungated_ratio"] is None or r["ungated_ratio"] > 1 + TOLERANCE]
    if misses:
        lines.append("  ungated misses: " + "; ".join(
            f"{r['kernel']} {r['shape']} {r['ungated_key']} {fmt_ratio(r['ungated_ratio'])} "
            f"(tuned {r['tuned_best']}, score {r.get('score')})" for r in misses))
    return lines


def _stored(meta: dict[str, Any]) -> str:
    stored = meta.get("stored")
    if isinstance(stored, dict):  # reports per chip
        return ", ".join(f"{v} {k} reports" for k, v in sorted(stored.items())) + " stored"
    return f"{stored} stored"


def agreement_lines(per_run: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """Where two runs (each tuned anew) disagree: the tuned best, or an ungated pick's within-5 % verdict."""
    a, b = per_run[0], per_run[1]
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if "skipped" not in x and "skipped" not in y]
    same_best = sum(x["tuned_best"] == y["tuned_best"] for x, y in pairs)
    flips = [(x, y) for x, y in pairs if x.get("ungated_key") and x["ungated_key"] != "builtin"
             and (x["ungated_ratio"] is not None and x["ungated_ratio"] <= 1 + TOLERANCE)
             != (y["ungated_ratio"] is not None and y["ungated_ratio"] <= 1 + TOLERANCE)]
    def spread(kind: str) -> str:
        d = sorted(max(x["tuned_us"], y["tuned_us"]) / min(x["tuned_us"], y["tuned_us"]) - 1 for x, y in pairs
                   if x["kind"] == kind and x.get("tuned_us") and y.get("tuned_us"))
        if not d:
            return f"{kind} -"
        return f"{kind} shapes at most {100 * d[-1]:.1f}% (median {100 * d[len(d) // 2]:.1f}%)"

    return [
        "run 1 vs run 2 (each tuned anew on the same GPU; the side-by-side medians within one run are the "
        "referee)",
        f"  same tuned best: {same_best}/{len(pairs)}; the tuned best's median differs between the runs by: "
        f"{spread('large')}; {spread('decode')} (launch-bound, 13-30 µs)",
        "  ungated picks whose within-5% verdict differs: " + ("; ".join(
            f"{x['kernel']} {x['shape']} {fmt_ratio(x['ungated_ratio'])} vs {fmt_ratio(y['ungated_ratio'])}"
            for x, y in flips) or "none"),
    ]


def calibration_lines(meta: dict[str, Any]) -> list[str]:
    """The transfer bins each kernel's entries were gated by (their calibration never saw the target's
    results for that kernel), and what the profile is with no target result at all."""
    folds: dict[str, Any] = meta.get("folds") or {}
    first: dict[str, Any] = next(iter(folds.values()), {})
    edges = [b for b in first.get("bins", []) if b["mode"] == "transfer"]
    lines = ["calibration per kernel (profile_builder.calibrate without the target's results for that "
             "kernel): transfer mode (another chip's measured pick at the very shape), per score bin: "
             "held-out samples, hits -> confidence (isotonic in the score)",
             f"  {'kernel':<20} {'samples':>7}  " + "  ".join(f"{b['lo']:.1f}-{b['hi']:.1f}".ljust(15)
                                                          for b in edges)]
    for kernel, cal in folds.items():
        cells = [f"{b['n']:>3} {b['hits']:>3} -> {b['rate']:.2f}" for b in cal.get("bins", [])
                 if b["mode"] == "transfer"]
        lines.append(f"  {kernel:<20} {cal.get('samples', 0):>7}  " + "  ".join(c.ljust(15) for c in cells))
    cold = meta.get("cold")
    if cold:
        lines.append("with no result of the target at all (no transfer between the two chips to calibrate "
                     f"on: every confidence is the 0.5 prior): {cold.get('counts')}")
    return lines


def fmt_ratio(x: float | None) -> str:
    return "failed" if x is None else f"{(x - 1) * 100:+.1f}%"


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="build the target's profile from the other GPU's reports (CPU)")
    p.add_argument("--target", choices=sorted(CHIPS), required=True)
    p.add_argument("--out", type=Path, required=True,
                   help="the jobs file (no default: a committed one records what was planned before a run)")
    r = sub.add_parser("run", help="tune and time the jobs on this GPU")
    r.add_argument("--jobs", type=Path, required=True)
    r.add_argument("--outdir", type=Path, required=True)
    r.add_argument("--kernels", help="comma-separated subset")
    r.add_argument("--budget", type=float, default=480.0, help="seconds by which every timed turn must end")
    r.add_argument("--rounds", type=int, default=REFEREE_ROUNDS)
    r.add_argument("--tag", default="gpu")
    r.add_argument("--kept-only", action="store_true",
                   help="time only the entries the profile keeps (the fallbacks are the built-in)")
    u = sub.add_parser("unit")
    u.add_argument("--unit", required=True)
    u.add_argument("--outdir", type=Path, required=True)
    u.add_argument("--rounds", type=int, default=REFEREE_ROUNDS)
    u.add_argument("--deadline", type=float, required=True)
    s = sub.add_parser("score", help="the table and summary from the jobs and the GPU's results")
    s.add_argument("--jobs", type=Path, required=True)
    s.add_argument("results", nargs="+", type=Path, help="result files, one per run (the first is tabled)")
    s.add_argument("--out", type=Path)
    s.add_argument("--note", help="a line under the title (e.g. that the runs predate the plan)")
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        return plan(args.target, args.out)
    if args.cmd == "run":
        os.environ.setdefault("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")
        return run(args.jobs, args.outdir, args.kernels.split(",") if args.kernels else None, args.budget,
                   args.rounds, args.tag, args.kept_only)
    if args.cmd == "unit":
        os.environ.setdefault("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")
        unit = json.loads(args.unit)
        run_unit(unit, args.outdir / "turns", args.outdir, args.rounds, args.deadline)
        return 0
    print(score(args.jobs, args.results, args.out, args.note), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
