"""Dashboard page server times over 1,000,000 stored trials.

A load generator: it bulk-inserts a realistic fleet history straight into a fresh, migrated
database (SQLAlchemy core ``executemany``; the coordinator's API is not the point here), starts a
real coordinator (``kernelfleet serve`` under uvicorn) on it, and times every dashboard page with
httpx: one warm-up request, then the median of ``--repeat`` requests, wall time at the client.

Data (defaults): 5 chips x 12 kernels x 8 shapes x 3 dtypes = 1,440 series, 70 runs each spread
over 90 days (MLX 0.32.3, then 0.32.4 for the last third), 10 trials per run with 16 raw samples
each -> 100,800 results and 1,008,000 trials; one done job per run in 70 campaigns; 10 workers;
300 regressions; 30 profile versions. Golden samples hold 64 values (the contract allows 256) to
keep the file size reasonable.

    python benchmarks/dashboard.py                       # SQLite in a temp folder
    python benchmarks/dashboard.py --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlalchemy import Engine, func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from kernelfleet.kernels.catalog import NAMES
from kernelfleet.service.db import make_engine
from kernelfleet.service.migrate import upgrade
from kernelfleet.service.models import Campaign, Job, Profile, Regression, Result, Trial, Worker
from kernelfleet.service.targets import target_id

CHIPS = [
    ("Apple M3 Max", "metal", "macOS 15.1", 1.0),
    ("Apple M2", "metal", "macOS 14.6", 2.1),
    ("Apple M4 Pro", "metal", "macOS 15.2", 0.8),
    ("NVIDIA H100 80GB HBM3", "cuda", "Linux 6.1", 0.3),
    ("NVIDIA H200", "cuda", "Linux 6.8", 0.25),
]
KERNELS = list(NAMES)
SHAPES = ["1x4096", "8x4096", "32x4096", "128x4096", "512x4096", "1024x8192", "4096x4096", "16384x8192"]
DTYPES = ["float16", "bfloat16", "float32"]
CONFIGS = [{"tg": tg, "vec": vec} for tg in (64, 128, 256, 512, 1024) for vec in (2, 4)][:9]
CONSOLE = Console()
BATCH = 20_000


def config_key(c: dict[str, Any]) -> str:
    return "builtin" if c == {"variant": "builtin"} else ",".join(f"{k}={c[k]}" for k in sorted(c))


def _chunks(rows: list[dict[str, Any]], n: int = BATCH) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(rows), n):
        yield rows[i : i + n]


def generate(engine: Engine, runs: int, trials_per_run: int, seed: int = 0, days: int = 90) -> dict[str, Any]:
    """Insert the whole history; returns ids the page list needs."""
    rng = random.Random(seed)
    t0 = datetime.now(UTC) - timedelta(days=days)
    step = timedelta(days=days) / runs
    with engine.begin() as conn:
        workers = []
        for ci, (chip, backend, os_name, _) in enumerate(CHIPS):
            for k in range(2):
                workers.append(
                    {
                        "name": f"{chip.split()[-1].lower()}-{k}",
                        "token_digest": secrets.token_hex(32),
                        "chip": chip,
                        "backend": backend,
                        "os": os_name,
                        "mlx_version": "0.32.4",
                        "last_heartbeat_at": datetime.now(UTC) - timedelta(seconds=30 + 600 * k * ci),
                    }
                )
        conn.execute(insert(Worker), workers)
        worker_ids = {
            chip: [w for (w,) in conn.execute(select(Worker.id).where(Worker.chip == chip))]
            for chip, *_ in CHIPS
        }
        spec = {"kernels": KERNELS, "shapes": SHAPES, "dtypes": DTYPES}
        conn.execute(
            insert(Campaign),
            [
                {"name": f"nightly {i + 1}", "max_attempts": 3, "spec": spec, "created_at": t0 + step * i}
                for i in range(runs)
            ],
        )
        campaign_ids = [c for (c,) in conn.execute(select(Campaign.id).order_by(Campaign.id))]
    with Session(engine) as session, session.begin():  # one job target per chip (service/targets.py)
        targets = {chip: target_id(session, None, chip) for chip, *_ in CHIPS}
    total = runs * len(CHIPS) * len(KERNELS) * len(SHAPES) * len(DTYPES)
    result_id = 0
    first_regression_pairs: list[tuple[int, int, str, str, str, str, float, float]] = []
    with Progress(console=CONSOLE) as progress:
        task = progress.add_task(f"inserting {total:,} runs x {trials_per_run} trials", total=total)
        for run in range(runs):
            mlx = "0.32.3" if run < runs * 2 // 3 else "0.32.4"
            jobs: list[dict[str, Any]] = []
            results: list[dict[str, Any]] = []
            trials: list[dict[str, Any]] = []
            with engine.begin() as conn:
                next_job = (conn.scalar(select(func.max(Job.id))) or 0) + 1
                next_result = (conn.scalar(select(func.max(Result.id))) or 0) + 1
                next_trial = (conn.scalar(select(func.max(Trial.id))) or 0) + 1
            for chip, backend, os_name, speed in CHIPS:
                for kernel in KERNELS:
                    for shape in SHAPES:
                        for dtype in DTYPES:
                            rows, cols = (int(d) for d in shape.split("x"))
                            base = (5 + rows * cols * (4 if dtype == "float32" else 2) / 4e5) * speed
                            if mlx == "0.32.4" and kernel == "rmsnorm" and backend == "metal":
                                base *= 1.12
                            created = t0 + step * run + timedelta(seconds=rng.uniform(0, 3000))
                            job_id, result_id = next_job + len(jobs), next_result + len(results)
                            jobs.append(
                                {
                                    "id": job_id,
                                    "campaign_id": campaign_ids[run],
                                    "kind": "tune",
                                    "kernel": kernel,
                                    "shape": shape,
                                    "dtype": dtype,
                                    "state": "done",
                                    "attempts": 1,
                                    "max_attempts": 3,
                                    "target_chip": chip,
                                    "target_id": targets[chip],
                                    "leased_by": rng.choice(worker_ids[chip]),
                                    "created_at": created,
                                    "updated_at": created,
                                    "available_at": created,
                                    "finished_at": created,
                                }
                            )
                            best: tuple[float, dict[str, Any]] | None = None
                            builtin_median = 0.0
                            for ti in range(trials_per_run):
                                config = (
                                    {"variant": "builtin"} if ti == 0 else CONFIGS[(ti - 1) % len(CONFIGS)]
                                )
                                status = (
                                    "compile_error" if ti == trials_per_run - 1 and kernel == "rope" else "ok"
                                )
                                factor = (
                                    1.3
                                    if ti == 0
                                    else 0.85
                                    + 0.4 * (zlib.crc32(f"{chip}{kernel}{shape}{ti}".encode()) % 97) / 97
                                )
                                median = base * factor * (1 + rng.gauss(0, 0.01))
                                samples = sorted(
                                    round(median * (1 + rng.gauss(0, 0.02)), 3) for _ in range(16)
                                )
                                ok = status == "ok"
                                trial = {
                                    "id": next_trial + len(trials),
                                    "result_id": result_id,
                                    "config_key": config_key(config),
                                    "config": config,
                                    "is_builtin": ti == 0,
                                    "status": status,
                                    "error": None if ok else "threadgroup too large",
                                    "median_us": samples[8] if ok else None,
                                    "p10_us": samples[1] if ok else None,
                                    "p90_us": samples[14] if ok else None,
                                    "n": 16 if ok else 0,
                                    "samples_us": samples if ok else None,
                                    "max_abs_err": 1e-4 if ok else None,
                                    "max_rel_err": 2e-4 if ok else None,
                                }
                                trials.append(trial)
                                if ti == 0:
                                    builtin_median = samples[8]
                                if ok and (best is None or samples[8] < best[0]):
                                    best = (samples[8], trial)
                            assert best is not None
                            sample = [round(math.sin(i + len(kernel)) * 2, 5) for i in range(64)]
                            results.append(
                                {
                                    "id": result_id,
                                    "job_id": job_id,
                                    "worker_id": jobs[-1]["leased_by"],
                                    "lease_token": None,
                                    "payload_digest": secrets.token_hex(32),
                                    "response": {},
                                    "source": "lease",
                                    "kernel": kernel,
                                    "shape": shape,
                                    "dtype": dtype,
                                    "chip": chip,
                                    "backend": backend,
                                    "mlx_version": mlx,
                                    "os": os_name,
                                    "driver": "580.65" if backend == "cuda" else None,
                                    "kernel_hash": hashlib.sha256(kernel.encode()).hexdigest()[:16],
                                    "strategy": "halving",
                                    "best_config_key": best[1]["config_key"],
                                    "best_is_builtin": best[1]["is_builtin"],
                                    "best_median_us": best[0],
                                    "best_p10_us": best[1]["p10_us"],
                                    "best_p90_us": best[1]["p90_us"],
                                    "builtin_median_us": builtin_median,
                                    "golden": {
                                        "digest": hashlib.sha256(str(sample).encode()).hexdigest(),
                                        "stats": {
                                            "mean": 0.0,
                                            "std": 1.4,
                                            "min": -2.0,
                                            "max": 2.0,
                                            "abs_mean": 1.2,
                                        },
                                        "sample": sample,
                                        "stride": 4096,
                                        "numel": 64 * 4096,
                                    },
                                    "created_at": created,
                                }
                            )
                            if run == runs * 2 // 3 and kernel == "rmsnorm" and backend == "metal":
                                first_regression_pairs.append(
                                    (result_id, 0, chip, kernel, shape, dtype, 0.0, best[0])
                                )
            with engine.begin() as conn:
                for chunk in _chunks(jobs):
                    conn.execute(insert(Job), chunk)
                for chunk in _chunks(results):
                    conn.execute(insert(Result), chunk)
                for chunk in _chunks(trials):
                    conn.execute(insert(Trial), chunk)
            progress.advance(task, len(results))
    _extras(engine, rng, runs, campaign_ids, worker_ids, first_regression_pairs, t0, step)
    return {"campaign": campaign_ids[-1], "result": result_id}


def _extras(
    engine: Engine,
    rng: random.Random,
    runs: int,
    campaign_ids: list[int],
    worker_ids: dict[str, list[int]],
    pairs: list[tuple[int, int, str, str, str, str, float, float]],
    t0: datetime,
    step: timedelta,
) -> None:
    """Regressions (300), profiles (3 versions x 2 MLX versions on 5 chips), queued and dead jobs."""
    with Session(engine) as session, session.begin():
        targets = {chip: target_id(session, None, chip) for chip, *_ in CHIPS}
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:  # explicit ids were inserted: move the sequences past them
            for table in ("jobs", "results", "trials"):
                conn.execute(
                    text(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"(SELECT max(id) FROM {table}))"
                    )
                )
    with engine.begin() as conn:
        regs = []
        for i in range(300):
            rid, _, chip, kernel, shape, dtype, _, new = pairs[i % len(pairs)]
            status = ["open", "confirming", "acknowledged", "dismissed"][i % 4]
            regs.append(
                {
                    "group_key": "mlx_version=0.32.3->0.32.4" if i < len(pairs) else f"series:{i}",
                    "kernel": kernel,
                    "shape": shape,
                    "dtype": dtype,
                    "chip": chip,
                    "config_key": None,
                    "status": status,
                    "detector": "step" if i % 3 else "changepoint",
                    "baseline_median_us": new / 1.12,
                    "new_median_us": new,
                    "effect": 0.12,
                    "p_value": 0.001,
                    "cause": {"mlx_version": ["0.32.3", "0.32.4"]},
                    "baseline_result_id": None,
                    "result_id": rid,
                    "detected_at": t0 + step * (runs * 2 // 3) + timedelta(minutes=i),
                }
            )
        conn.execute(insert(Regression), regs)
        profiles = []
        for chip, *_ in CHIPS:
            for mlx in ("0.32.3", "0.32.4"):
                for version in (1, 2, 3):
                    entries = [
                        {
                            "kernel": k,
                            "shape": s,
                            "dtype": d,
                            "config": {"tg": 256, "vec": 4},
                            "config_key": "tg=256,vec=4",
                            "median_us": 10.0,
                            "speedup": 1.2,
                            "predicted": (i % 5 == 0),
                        }
                        for i, (k, s, d) in enumerate(
                            (k, s, d) for k in KERNELS for s in SHAPES for d in DTYPES
                        )
                    ]
                    profiles.append(
                        {
                            "chip": chip,
                            "mlx_version": mlx,
                            "version": version,
                            "etag": secrets.token_hex(16),
                            "body": {"entries": entries},
                            "created_at": t0 + step * (runs - 10 + version),
                        }
                    )
        conn.execute(insert(Profile), profiles)
        extra = []
        for i in range(200):
            chip = CHIPS[i % len(CHIPS)][0]
            dead = i % 10 == 0
            extra.append(
                {
                    "campaign_id": campaign_ids[-1],
                    "kind": "tune",
                    "kernel": KERNELS[i % 12],
                    "shape": "2048x2048",
                    "dtype": "float16",
                    "state": "dead" if dead else "queued",
                    "attempts": 3 if dead else 0,
                    "max_attempts": 3,
                    "target_chip": chip,
                    "target_id": targets[chip],
                    "last_error": "launch_error: out of resources" if dead else None,
                }
            )
        conn.execute(insert(Job), extra)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(
        os.environ, KERNELFLEET_DATABASE_URL=url, KERNELFLEET_ADMIN_TOKEN="bench-" + secrets.token_hex(8)
    )
    log = open(workdir / "coordinator.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet.worker.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit((workdir / "coordinator.log").read_text())
        time.sleep(0.2)
    raise SystemExit("coordinator did not start")


def pages(ids: dict[str, Any]) -> list[str]:
    m3, h100 = quote("Apple M3 Max", safe=""), quote("NVIDIA H100 80GB HBM3", safe="")
    return [
        "/",
        "/chips",
        "/kernels",
        f"/chips/{m3}",
        f"/chips/{m3}?kernel=softmax&dtype=float16",
        "/kernels/rmsnorm",
        "/kernels/softmax?dtype=float32",
        f"/compare?a={m3}&b={h100}",
        f"/compare?chip={m3}&mlx_a=0.32.3&mlx_b=0.32.4",
        "/regressions",
        "/regressions?status=all",
        "/regressions/1",
        "/campaigns",
        f"/campaigns/{ids['campaign']}",
        f"/campaigns/{ids['campaign']}?state=done&offset=1000",
        "/profiles",
        f"/runs/{ids['result']}",
    ]


def measure(base: str, paths: list[str], repeat: int) -> list[tuple[str, int, float, float, int]]:
    out = []
    with httpx.Client(base_url=base, timeout=120) as client:
        for path in paths:
            client.get(path)  # warm-up
            times, status, size = [], 0, 0
            for _ in range(repeat):
                start = time.perf_counter()
                r = client.get(path)
                times.append((time.perf_counter() - start) * 1000)
                status, size = r.status_code, len(r.content)
            out.append((path, status, statistics.median(times), max(times), size))
    return out


def run_one(label: str, url: str, workdir: Path, runs: int, trials: int, repeat: int) -> list[str]:
    CONSOLE.print(f"[bold]{label}[/]: migrating {make_url(url).render_as_string(hide_password=True)}")
    upgrade(url)
    engine = make_engine(url)
    start = time.perf_counter()
    ids = generate(engine, runs, trials)
    with engine.connect() as conn:
        n_trials = conn.scalar(select(func.count()).select_from(Trial))
        n_results = conn.scalar(select(func.count()).select_from(Result))
    engine.dispose()
    load_s = time.perf_counter() - start
    proc, base = serve(url, workdir)
    try:
        rows = measure(base, pages(ids), repeat)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    table = Table(title=f"{label}: {n_trials:,} trials in {n_results:,} results (loaded in {load_s:.0f} s)")
    for col in ("page", "status", "median ms", "max ms", "KiB", "< 500 ms"):
        table.add_column(col, justify="left" if col == "page" else "right")
    lines = [
        f"{label}: {n_trials:,} trials, {n_results:,} results; median of {repeat} requests after 1 warm-up",
        f"{'page':<64} {'status':>6} {'median ms':>10} {'max ms':>8} {'KiB':>7}  target",
    ]
    for path, status, med, mx, size in rows:
        ok = "ok" if med < 500 and status == 200 else "MISS"
        table.add_row(path, str(status), f"{med:.0f}", f"{mx:.0f}", f"{size / 1024:.0f}", ok)
        lines.append(f"{path:<64} {status:>6} {med:>10.1f} {mx:>8.1f} {size / 1024:>7.0f}  {ok}")
    CONSOLE.print(table)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=70, help="runs per series (default 70: 1,008,000 trials)")
    ap.add_argument("--trials", type=int, default=10, help="trials per run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--postgres", help="PostgreSQL server URL; a fresh database is created on it and dropped")
    ap.add_argument("--skip-sqlite", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "dashboard.txt"))
    args = ap.parse_args()
    lines = [
        f"KernelFleet dashboard benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs; page time = wall time at an httpx client against `kernelfleet serve`",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        work = Path(tmp)
        if not args.skip_sqlite:
            lines += run_one(
                "SQLite", f"sqlite:///{work / 'bench.db'}", work, args.runs, args.trials, args.repeat
            )
            lines.append("")
        if args.postgres:
            import psycopg

            name = "kf_bench_" + secrets.token_hex(4)
            admin = make_url(args.postgres).set(drivername="postgresql").render_as_string(hide_password=False)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            try:
                url = make_url(args.postgres).set(database=name).render_as_string(hide_password=False)
                lines += run_one("PostgreSQL", url, work, args.runs, args.trials, args.repeat)
            finally:
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    CONSOLE.print(f"saved {args.out}")


if __name__ == "__main__":
    main()
