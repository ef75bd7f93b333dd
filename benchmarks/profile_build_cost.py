"""Profile build cost against the number of stored ``config_stats`` rows, or of current series, on
SQLite and PostgreSQL.

    python benchmarks/profile_build_cost.py [--rows 10000,100000,1000000]
        [--postgres postgresql://postgres@127.0.0.1:5432/test] [--rounds 3] [--databases sqlite,postgresql]
    python benchmarks/profile_build_cost.py --growth 1000,4000,10000 [--rounds 3] [--databases ...]

For each size, a fresh database (SQLite file in a temporary folder; PostgreSQL database created
beside the given one and dropped afterwards) is migrated and filled:

- **the fleet**: 8 chips (5 Apple on Metal, 3 NVIDIA on CUDA), about 10,000 stats rows of current
  series (kernel, shape, dtype per chip; the catalog's configs valid at each shape, ~40 a series),
  inserted by executemany;
- **history**: copies of those rows under older kernel sources (``kernel_hash``), made by
  ``INSERT ... SELECT`` in SQL, up to the row count. Older sources are what a long-lived fleet
  accumulates (every kernel change is tuned again); no profile shows them, but a build that reads
  every row of the backend pays for them.

Then, per round, for one Apple chip:

- **incremental**: one real report of one of the chip's current series is stored with
  ``store_report`` (a result, as a completion stores it) and the chip's profiles are built by
  :func:`kernelfleet.service.profile_builder.build_chip` with the builder's series cache warm (it
  rereads only the changed series);
- **full**: the cache is dropped (:func:`kernelfleet.service.series_summaries.forget`) and the chip
  is built again, as the first build of a process does: a GROUP BY in SQL picks each series' newest
  kernel source, and only those series' rows are read;
- **every row** (once, up to ``--every-row-max`` rows): the chip-wide body made from every stats row
  of the backend, as every build did before the series cache.

Prints the median of the rounds per size and database. The incremental build should stay flat in
total rows; what it still grows with is the current fleet (predictions compare every current series
of a kernel), which ``--rows`` holds fixed.

``--growth`` (results/profile_build_growth.txt) grows the current fleet instead, as a fleet where
every job is a new (kernel, shape, dtype) does: per size, that many current series over the 8 chips
(each chip, the target included, measures a (kernel, shape, dtype) with probability 1/2, so the
target predicts the other half; no history), then per round one real report of a *new* series from
another Apple chip (the target's predictions change), the target's incremental build, and a full
build after dropping the cache. A build predicts every fleet shape the chip did not measure from
every current series of its kernel: O(series^2) pairs, each over ~40 configs, for one chip.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.spec import config_key, format_shape
from kernelfleet.service import profile_builder, profiles, series_summaries
from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.migrate import upgrade
from kernelfleet.service.models import ConfigStat, ProfileRequest
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings

CHIPS = {"metal": ["Apple M1 Max", "Apple M2 Ultra", "Apple M3 Max", "Apple M4 Pro", "Apple M4 Max"],
         "cuda": ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100 80GB"]}
TARGET = "Apple M3 Max"
FLEET_ROWS = 10_000
MLX = "0.30.0"
KERNELS = [n for n in NAMES if "quantized" not in n]
COLUMNS = [c.name for c in ConfigStat.__table__.columns if c.name != "id"]
console = Console(stderr=True)


def _fleet_rows(rng: random.Random, series: int | None = None, target_share: float = 1.0
                ) -> list[dict[str, Any]]:
    """About ``FLEET_ROWS`` stats rows of current series, or ``series`` series when given; the target
    chip measures a (kernel, shape, dtype) with probability ``target_share``, each other chip with 1/2."""
    now, result_id = datetime.now(UTC), 0
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, tuple[int, ...], str]] = set()
    while (len(rows) < FLEET_ROWS) if series is None else (result_id < series):
        kernel = rng.choice(KERNELS)
        spec = get_spec(kernel)
        base = rng.choice([s for shapes in spec.shapes.values() for s in shapes])
        shape = tuple(max(1, d * rng.choice([1, 2, 3, 4, 6, 8]) // rng.choice([1, 2, 4])) for d in base)
        dtype = rng.choice(spec.dtypes)
        if (kernel, shape, dtype) in seen:
            continue
        seen.add((kernel, shape, dtype))
        try:
            configs = [config_key(c) for c in spec.space(shape, dtype)][:39]
        except Exception:
            continue
        for backend, chips in CHIPS.items():
            for chip in chips:
                if rng.random() >= (target_share if chip == TARGET else 0.5):
                    continue
                result_id += 1
                builtin = rng.uniform(5, 500)
                for key in ["builtin", *configs]:
                    t = builtin * (1.0 if key == "builtin" else rng.uniform(0.7, 1.6))
                    s = builtin / t
                    rows.append(dict(
                        chip=chip, backend=backend, mlx_version=MLX, kernel=kernel, shape=format_shape(shape),
                        dtype=dtype, kernel_hash=f"{kernel}-h0", config_key=key, config={},
                        is_builtin=key == "builtin", runs=3, imported_runs=3, worker_ids=[],
                        first_seen_at=now, last_seen_at=now, last_result_id=result_id, medians_us=[t] * 3,
                        speedups=[[s * 0.95, s, s * 1.05]] * 3, center_us=t, spread=0.01,
                        **({"speedup": None, "speedup_lo": None, "speedup_hi": None} if key == "builtin" else
                           {"speedup": s, "speedup_lo": s * 0.95, "speedup_hi": s * 1.05})))
    return rows


def fill(url: str, total: int, series: int | None = None) -> tuple[int, float]:
    """The fleet, then history copies in SQL up to ``total`` rows; returns (rows, seconds). With
    ``series``: a fleet of that many current series (the target measuring half the fleet's shapes,
    as every chip does), no history."""
    started = time.perf_counter()
    upgrade(url)
    engine = make_engine(url)
    try:
        rows = _fleet_rows(random.Random(7)) if series is None else _fleet_rows(random.Random(7), series, 0.5)
        with engine.begin() as conn:
            for start in range(0, len(rows), 5000):
                conn.execute(insert(ConfigStat.__table__), rows[start:start + 5000])
        copies = max(0, round(total / len(rows)) - 1)
        names = ", ".join(COLUMNS)
        picked = ", ".join("kernel_hash || '-old' || :copy" if c == "kernel_hash" else
                           "0" if c == "last_result_id" else c for c in COLUMNS)
        with engine.begin() as conn:
            for copy in range(1, copies + 1):
                conn.execute(text(f"INSERT INTO config_stats ({names}) SELECT {picked} FROM config_stats "
                                  f"WHERE kernel_hash NOT LIKE '%-old%'"), {"copy": str(copy)})
            if engine.dialect.name == "postgresql":
                conn.execute(text("ANALYZE"))
        with engine.connect() as conn:
            count = conn.scalar(select(func.count()).select_from(ConfigStat)) or 0
    finally:
        engine.dispose()
    return count, time.perf_counter() - started


def _one_result(factory: sessionmaker[Session], rng: random.Random) -> None:
    """Store one real report of one of the target chip's current series (a small change)."""
    with factory() as session:
        kernel, shape, dtype = rng.choice(session.execute(
            select(ConfigStat.kernel, ConfigStat.shape, ConfigStat.dtype).distinct()
            .where(ConfigStat.chip == TARGET, ConfigStat.kernel_hash.not_like("%-old%"))).all())
    report = {
        "kernel": kernel, "shape": shape, "dtype": dtype, "seed": 0, "strategy": "halving",
        "env": {"chip": TARGET, "backend": "metal", "mlx_version": MLX, "os": "macOS 15.1", "driver": None,
                "kernel_hash": f"{kernel}-h0", "gpu_cores": 40, "memory_bytes": 2**36},
        "trials": [{"config_key": "builtin", "config": {"variant": "builtin"}, "is_builtin": True,
                    "status": "ok", "error": None, "samples_us": None, "median_us": rng.uniform(5, 500),
                    "p10_us": None, "p90_us": None, "n": 20, "max_abs_err": 0.0, "max_rel_err": 0.0}],
        "best_config_key": "builtin",
        "golden": {"digest": secrets.token_hex(32),
                   "stats": {"mean": 0.0, "std": 1.0, "min": -4.0, "max": 4.0, "abs_mean": 0.8},
                   "sample": [0.1], "stride": 1, "numel": 1},
    }
    with factory() as session, immediate(session):
        store_report(session, TuningReport.model_validate(report), source="import")


def _new_series_result(factory: sessionmaker[Session], rng: random.Random) -> None:
    """Store one real report of a (kernel, shape, dtype) no chip measured before, from another Apple
    chip than the target (a job of a growing fleet: every job a new series), with its configs' trials."""
    with factory() as session:
        known = set(session.execute(
            select(ConfigStat.kernel, ConfigStat.shape, ConfigStat.dtype).distinct()).all())
    while True:
        kernel = rng.choice(KERNELS)
        spec = get_spec(kernel)
        base = rng.choice([s for shapes in spec.shapes.values() for s in shapes])
        shape = tuple(max(1, d * rng.randint(1, 64) // rng.choice([1, 2, 4, 8])) for d in base)
        dtype = rng.choice(spec.dtypes)
        if (kernel, format_shape(shape), dtype) in known:
            continue
        try:
            configs = spec.space(shape, dtype)[:39]
        except Exception:
            continue
        break
    chip = rng.choice([c for c in CHIPS["metal"] if c != TARGET])
    builtin = rng.uniform(5, 500)

    def trial(config: dict[str, Any], key: str, median: float) -> dict[str, Any]:
        return {"config_key": key, "config": config, "is_builtin": key == "builtin", "status": "ok",
                "error": None, "samples_us": None, "median_us": median, "p10_us": None, "p90_us": None,
                "n": 20, "max_abs_err": 0.0, "max_rel_err": 0.0}

    trials = [trial({"variant": "builtin"}, "builtin", builtin),
              *(trial(dict(c), config_key(c), builtin * rng.uniform(0.7, 1.6)) for c in configs)]
    report = {
        "kernel": kernel, "shape": format_shape(shape), "dtype": dtype, "seed": 0, "strategy": "halving",
        "env": {"chip": chip, "backend": "metal", "mlx_version": MLX, "os": "macOS 15.1", "driver": None,
                "kernel_hash": f"{kernel}-h0", "gpu_cores": 40, "memory_bytes": 2**36},
        "trials": trials,
        "best_config_key": min(trials, key=lambda t: t["median_us"])["config_key"],
        "golden": {"digest": secrets.token_hex(32),
                   "stats": {"mean": 0.0, "std": 1.0, "min": -4.0, "max": 4.0, "abs_mean": 0.8},
                   "sample": [0.1], "stride": 1, "numel": 1},
    }
    with factory() as session, immediate(session):
        store_report(session, TuningReport.model_validate(report), source="import")


def _build(factory: sessionmaker[Session], settings: Settings) -> float:
    with factory() as session, immediate(session):
        session.add(ProfileRequest(chip=TARGET))
    started = time.perf_counter()
    assert profile_builder.build_chip(factory, TARGET, settings)
    return time.perf_counter() - started


def every_row(factory: sessionmaker[Session]) -> float:
    """Seconds to make the chip-wide body from every stats row of the backend, as each build did
    before the series cache (``profiles.build_body`` without summaries; once, not per round)."""
    started = time.perf_counter()
    with factory() as session:
        assert profiles.build_body(session, TARGET, None, threshold=0.8) is not None
    return time.perf_counter() - started


def measure(url: str, rounds: int, old: bool, new_series: bool = False) -> tuple[float, float, float | None]:
    """(median incremental build s, median full build s, every-row body s or None) over ``rounds``;
    each round's result is of one of the target's series, or with ``new_series`` of a new one."""
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    settings = Settings(database_url=url, profile_min_interval_seconds=0)
    rng = random.Random(11)
    series_summaries.forget()
    try:
        _build(factory, settings)  # warm: the cache, and the catalog's config spaces (per process)
        incremental, full = [], []
        for _ in range(rounds):
            (_new_series_result if new_series else _one_result)(factory, rng)
            incremental.append(_build(factory, settings))
            series_summaries.forget()
            full.append(_build(factory, settings))
        return statistics.median(incremental), statistics.median(full), every_row(factory) if old else None
    finally:
        series_summaries.forget()
        engine.dispose()


def _postgres_db(base: str) -> tuple[str, str]:
    name = "kf_build_cost_" + secrets.token_hex(4)
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, make_url(base).set(database=name, drivername="postgresql+psycopg").render_as_string(
        hide_password=False)


def _drop(base: str, name: str) -> None:
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="10000,100000,1000000")
    parser.add_argument("--postgres", default=os.environ.get("KERNELFLEET_TEST_POSTGRES_URL"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--databases", default="sqlite,postgresql", help="which of sqlite,postgresql")
    parser.add_argument("--every-row-max", type=int, default=200_000,
                        help="time the every-row read (the old build) only up to this many rows")
    parser.add_argument("--growth", default=None,
                        help="instead of --rows: fleets of this many current series (e.g. 1000,4000,10000), "
                             "each round storing a result of a new series")
    args = parser.parse_args()
    if args.growth:
        _run(args, f"Profile build of {TARGET} after one result of a new series (median of {args.rounds})",
             ("current series", "stats rows", "fill s", "incremental build ms", "full build ms"),
             args.growth, _one_growth)
    else:
        _run(args, f"Profile build of {TARGET} after one stored result (median of {args.rounds})",
             ("stats rows", "fill s", "incremental build ms", "full build ms",
              "every row read (old build) ms"),
             args.rows, _one_history)


def _one_history(args: argparse.Namespace, url: str, total: int) -> tuple[str, ...]:
    """A fleet with history up to ``total`` rows: its figures (rows, fill, incremental, full, every row)."""
    count, fill_s = fill(url, total)
    console.log(f"{count:,} rows in {fill_s:.1f} s; building")
    inc, full, old = measure(url, args.rounds, total <= args.every_row_max)
    return (f"{count:,}", f"{fill_s:.1f}", f"{inc * 1000:.0f}", f"{full * 1000:.0f}",
            f"{old * 1000:.0f}" if old is not None else "not run")


def _one_growth(args: argparse.Namespace, url: str, size: int) -> tuple[str, ...]:
    """A fleet of ``size`` current series: its figures (series, rows, fill, incremental, first build)."""
    count, fill_s = fill(url, 0, series=size)
    console.log(f"{count:,} rows in {fill_s:.1f} s; building")
    inc, full, _ = measure(url, args.rounds, False, new_series=True)
    return (f"{size:,}", f"{count:,}", f"{fill_s:.1f}", f"{inc * 1000:.0f}", f"{full * 1000:.0f}")


def _run(args: argparse.Namespace, title: str, columns: tuple[str, ...], sizes: str,
         one: Callable[[argparse.Namespace, str, int], tuple[str, ...]]) -> None:
    """``one`` per size and database, as a table; the host's load average before and after."""
    table = Table(title=title)
    for column in ("database", *columns):
        table.add_column(column, justify="right")
    load = os.getloadavg()
    for size in (int(n) for n in sizes.split(",")):
        for label, url in _databases(args):
            console.log(f"{label}: size {size:,}")
            figures = one(args, url, size)
            table.add_row(label, *figures)
            console.log(f"{label}: {figures}")
    Console().print(table)
    print(f"host: {os.cpu_count()} CPUs; load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")


def _databases(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(label, URL) of a fresh database per wanted kind: a SQLite file in a temporary folder, a
    PostgreSQL database created beside ``--postgres`` (dropped after its turn)."""
    wanted = args.databases.split(",")
    if "sqlite" in wanted:
        with tempfile.TemporaryDirectory() as tmp:
            yield "sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}"
    if args.postgres and "postgresql" in wanted:
        created, created_url = _postgres_db(args.postgres)
        try:
            yield "postgresql", created_url
        finally:
            _drop(args.postgres, created)


if __name__ == "__main__":
    main()
