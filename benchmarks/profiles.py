"""Profile build and result insert against history length, on PostgreSQL.

    python benchmarks/profiles.py [--database-url postgresql://postgres@127.0.0.1:5432/test]
                                  [--checkpoints 1000,10000,100000] [--out results/profiles_scale.txt]

Grows one chip's history in fresh databases (created beside the given one, dropped afterwards; each
checkpoint's database starts as a copy of the previous one) by storing real-size reports (a
committed H100 report: its trials and raw samples, perturbed per run, spread over the catalog
kernels' shapes) through the coordinator's own ``store_report`` (which also updates
``config_stats``), in transactions of 500. Then, in interleaved rounds over all the databases
(shuffled each round, so load on this shared host hits every size alike), it times:

- **one result insert**: ``store_report`` + commit in its own transaction, as a completion does;
- **one profile build**: :func:`kernelfleet.service.profile_builder.build_chip` for that chip (the
  chip-wide profile and its MLX version's, from the stats rows; the insert before it queued the
  request it answers).

Storing through ``store_report`` costs tens of milliseconds a result on this 2-core host, so past
``--api-fill`` results (default 10,000) the history is grown by copying stored results and their
trials in bulk with SQL (doubling): those rows are real runs' copies, and the stats rows are
already at their bounded size by then (a window of 32 runs per config), so what grows is what a
profile build used to read (trials) and what an insert writes into (the indexes of results and
trials).

Both should stay flat: their cost depends on a result's trials and on the chip's series, not on
how many results are stored. The old path (every trial re-aggregated under one global lock, inside
the result request) took 0.56 s at 381 results and 58.7 s at 5,442 on this kind of host.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.migrate import upgrade
from kernelfleet.service.models import ConfigStat, Result
from kernelfleet.service.profile_builder import build_chip
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings

RESULTS = Path(__file__).parent / "results"
SOURCE = RESULTS / "h100_session_tuning.jsonl"
CHIP = "NVIDIA H100 80GB HBM3"
console = Console(stderr=True)


def templates() -> list[dict[str, Any]]:
    """The committed H100 reports (real trials and samples), one per (kernel, shape)."""
    return [json.loads(line) for line in SOURCE.read_text().splitlines() if line.strip()]


def perturbed(template: dict[str, Any], rng: random.Random) -> TuningReport:
    """A new run of ``template``: every sample scaled by one factor near 1 (run-to-run drift)."""
    factor = rng.uniform(0.97, 1.03)
    report = json.loads(json.dumps(template))
    for t in report["trials"]:
        if t["status"] == "ok":
            t["samples_us"] = [s * factor for s in t["samples_us"]] if t.get("samples_us") else None
            for k in ("median_us", "p10_us", "p90_us"):
                t[k] = t[k] * factor
    report["measured_at"] = "2026-11-26T00:00:00+00:00"
    return TuningReport.model_validate(report)


def new_database(base: str) -> tuple[str, str]:
    name = "kf_bench_" + secrets.token_hex(4)
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, make_url(base).set(database=name).render_as_string(hide_password=False)


def drop_database(base: str, name: str) -> None:
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def clone_database(base: str, source: str) -> tuple[str, str]:
    """A copy of database ``source`` (PostgreSQL's CREATE DATABASE ... TEMPLATE)."""
    name = "kf_bench_" + secrets.token_hex(4)
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    return name, make_url(base).set(database=name).render_as_string(hide_password=False)


def fill(factory: Any, pool: list[dict[str, Any]], rng: random.Random, n: int, bar: Progress,
         task: Any) -> None:
    """Store ``n`` perturbed reports through store_report, 500 per transaction."""
    while n > 0:
        batch = min(500, n)
        with factory() as session, immediate(session):
            for _ in range(batch):
                store_report(session, perturbed(rng.choice(pool), rng), source="lease")
        n -= batch
        bar.advance(task, batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--checkpoints", default="1000,10000,100000")
    ap.add_argument("--out", type=Path, default=RESULTS / "profiles_scale.txt")
    ap.add_argument("--api-fill", type=int, default=10_000,
                    help="store up to this many results through store_report; grow further by bulk copies")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved measurement rounds")
    args = ap.parse_args(argv)
    checkpoints = [int(x) for x in args.checkpoints.split(",")]
    pool = templates()
    rng = random.Random(0)
    made: list[str] = []
    engines: list[Any] = []
    try:
        with Progress(*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as bar:
            task = bar.add_task("storing results", total=checkpoints[-1])
            urls: list[str] = []
            stored = 0
            started = time.perf_counter()
            for target in checkpoints:
                if not made:
                    name, url = new_database(args.database_url)
                    upgrade(url)
                else:  # the previous checkpoint's database, grown further
                    name, url = clone_database(args.database_url, made[-1])
                made.append(name)
                urls.append(url)
                engine = make_engine(url)
                engines.append(engine)
                api = max(0, min(target, args.api_fill) - stored)
                fill(make_sessionmaker(engine), pool, rng, api, bar, task)
                stored += api
                if stored < target:
                    copied = copy_history(engine, target - stored)
                    stored += copied
                    bar.advance(task, copied)
                engine.dispose()  # CREATE DATABASE ... TEMPLATE needs the source idle
            fill_s = time.perf_counter() - started
        factories = [make_sessionmaker(e) for e in engines]
        settings = Settings(database_url=urls[0])
        samples: list[dict[str, list[float]]] = [{"insert": [], "build": []} for _ in factories]
        with Progress(console=console) as bar:
            task = bar.add_task("interleaved rounds", total=args.rounds)
            for _ in range(args.rounds):  # one insert and one build on every database per round
                for i in rng.sample(range(len(factories)), len(factories)):
                    insert_s, build_s = measure_once(factories[i], settings, pool, rng)
                    samples[i]["insert"].append(insert_s)
                    samples[i]["build"].append(build_s)
                bar.advance(task)
        rows = [summary(f, s) for f, s in zip(factories, samples, strict=True)]
        text = render(rows, fill_s, args.rounds)
    finally:
        for engine in engines:
            engine.dispose()
        for name in made:
            drop_database(args.database_url, name)
    print(text)
    args.out.write_text(text)
    console.print(f"written to {args.out}")
    return 0


RESULT_COLUMNS = ("worker_id, lease_token, payload_digest, response, source, kernel, shape, dtype, "
                  "chip, backend, mlx_version, os, driver, kernel_hash, strategy, best_config_key, "
                  "best_is_builtin, best_median_us, best_p10_us, best_p90_us, builtin_median_us, golden, "
                  "created_at, measured_at")
TRIAL_COLUMNS = ("config_key, config, is_builtin, status, error, median_us, p10_us, p90_us, n, samples_us, "
                 "max_abs_err, max_rel_err")


def copy_history(engine: Any, n: int) -> int:
    """Add ``n`` results (and their trials) by copying stored ones with SQL, doubling at most."""
    from sqlalchemy import text

    added = 0
    with engine.begin() as conn:
        while added < n:
            top = int(conn.scalar(text("SELECT max(id) FROM results")))
            take = min(n - added, top)
            shift = {"off": top, "take": take}
            conn.execute(text(f"INSERT INTO results (id, {RESULT_COLUMNS}) SELECT id + :off, "
                              f"{RESULT_COLUMNS} FROM results WHERE id <= :take"), shift)
            conn.execute(text(f"INSERT INTO trials (result_id, {TRIAL_COLUMNS}) SELECT result_id + :off, "
                              f"{TRIAL_COLUMNS} FROM trials WHERE result_id <= :take"), shift)
            added += take
        conn.execute(text("SELECT setval(pg_get_serial_sequence('results', 'id'), "
                          "(SELECT max(id) FROM results))"))
        conn.execute(text("ANALYZE results; ANALYZE trials"))
    return added


def measure_once(factory: Any, settings: Settings, pool: list[dict[str, Any]],
                 rng: random.Random) -> tuple[float, float]:
    """(seconds for one result insert with its commit, seconds for one profile build of the chip)."""
    report = perturbed(rng.choice(pool), rng)
    t = time.perf_counter()
    with factory() as session, immediate(session):
        store_report(session, report, source="lease")
    insert_s = time.perf_counter() - t
    t = time.perf_counter()
    assert build_chip(factory, CHIP, settings)  # the insert queued a request: there is a build to do
    return insert_s, time.perf_counter() - t


def summary(factory: Any, s: dict[str, list[float]]) -> dict[str, Any]:
    with factory() as session:
        results = session.scalar(select(func.count()).select_from(Result))
        stats = session.scalar(select(func.count()).select_from(ConfigStat))
        series = session.scalar(select(func.count()).select_from(
            select(ConfigStat.kernel, ConfigStat.shape, ConfigStat.dtype).distinct().subquery()))
    ins, bld = sorted(s["insert"]), sorted(s["build"])
    return {"results": results, "stats_rows": stats, "series": series,
            "insert_ms": round(1000 * statistics.median(ins), 2),
            "insert_p90_ms": round(1000 * ins[int(0.9 * (len(ins) - 1))], 2),
            "build_ms": round(1000 * statistics.median(bld), 1),
            "build_p90_ms": round(1000 * bld[int(0.9 * (len(bld) - 1))], 1)}


def render(rows: list[dict[str, Any]], fill_s: float, rounds: int) -> str:
    head = (f"{'stored results':>15} {'stats rows':>11} {'series':>7} {'insert ms (p50)':>16} "
            f"{'insert ms (p90)':>16} {'build ms (p50)':>15} {'build ms (p90)':>15}")
    lines = [
        "Profile build and result insert against stored history, one chip, PostgreSQL "
        f"({time.strftime('%Y-%m-%d')}, 2-core host; benchmarks/profiles.py)",
        f"reports: {SOURCE.name} ({len(templates())} real reports, {rows[-1]['series']} series), "
        "perturbed per run",
        f"{rounds} rounds, each one insert then one build on every database in shuffled order (so the "
        "host's load changes hit all sizes alike)",
        "", head,
    ]
    for r in rows:
        lines.append(f"{r['results']:>15,} {r['stats_rows']:>11,} {r['series']:>7} {r['insert_ms']:>16} "
                     f"{r['insert_p90_ms']:>16} {r['build_ms']:>15} {r['build_p90_ms']:>15}")
    first, last = rows[0], rows[-1]
    lines += [
        "",
        f"largest / smallest: insert {last['insert_ms'] / first['insert_ms']:.2f}x, "
        f"build {last['build_ms'] / first['build_ms']:.2f}x (target: within 2x)",
        f"filling {last['results']:,} results took {fill_s:.0f} s",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
