"""``GET /api/v1/results`` paging: keyset (``cursor``) against ``OFFSET`` at the same depth.

Fills a fresh database with ``--results`` runs (8 chips, 4 kernels, 3 revisions; no trials, which
the query never reads), then times :func:`kernelfleet.service.result_export.page` (the query the
route runs) for a page of ``--limit`` at several depths, beside the same page read with
``LIMIT/OFFSET``, and a filtered page (one chip and one revision). Median of ``--repeat`` runs, in
one process, one database, side by side.

    python benchmarks/results_paging.py                      # SQLite file in a temporary folder
    python benchmarks/results_paging.py --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import insert, select
from sqlalchemy.orm import Session, load_only

from kernelfleet.service.db import make_engine, make_sessionmaker
from kernelfleet.service.models import Result
from kernelfleet.service.result_export import COLUMNS, ResultFilter, page, row_of

CHIPS = [f"Apple M{i}" for i in range(1, 5)] + [f"NVIDIA H{i}00" for i in range(1, 5)]
KERNELS = ["rmsnorm", "softmax", "layernorm", "swiglu"]


def fill(session: Session, n: int) -> None:
    batch = 5000
    for start in range(0, n, batch):
        session.execute(insert(Result), [
            {"payload_digest": secrets.token_hex(32), "response": {}, "source": "import",
             "kernel": KERNELS[i % 4], "shape": f"{1 + i % 16}x4096", "dtype": "float16",
             "chip": CHIPS[i % 8], "backend": "metal" if i % 8 < 4 else "cuda", "mlx_version": "0.32.4",
             "revision": f"rev{i % 3}", "os": "os", "kernel_hash": "h", "strategy": "halving",
             "best_config_key": "tg=256", "best_is_builtin": False, "best_median_us": 10.0 + i % 7,
             "builtin_median_us": 12.0, "golden": {"digest": "0" * 64}}
            for i in range(start, min(n, start + batch))])


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def offset_page(session: Session, limit: int, offset: int) -> list[object]:
    stored = [getattr(Result, c) for c in COLUMNS if c != "speedup"]
    rows = session.scalars(select(Result).options(load_only(*stored)).order_by(Result.id.desc())
                           .limit(limit).offset(offset)).all()
    return [row_of(r) for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--postgres", help="PostgreSQL server URL (a fresh database is made there)")
    p.add_argument("--results", type=int, default=200_000)
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    if args.postgres:
        import psycopg

        name = "kf_paging_" + secrets.token_hex(4)
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = args.postgres.rsplit("/", 1)[0] + "/" + name

        def drop() -> None:
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cleanup = drop
    else:
        folder = tempfile.mkdtemp(prefix="kf-paging-")
        url = f"sqlite:///{Path(folder) / 'kernelfleet.db'}"
    try:
        subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", "db", "upgrade",
                        "--database-url", url], check=True, capture_output=True)
        engine = make_engine(url)
        factory = make_sessionmaker(engine)
        started = time.perf_counter()
        with factory() as session, session.begin():
            fill(session, args.results)
        took = time.perf_counter() - started
        print(f"{engine.dialect.name}: {args.results} results stored in {took:.1f} s; "
              f"page of {args.limit}, median of {args.repeat} (ms)")
        with factory() as session:
            newest = session.scalar(select(Result.id).order_by(Result.id.desc()).limit(1)) or 0
            print(f"{'depth (rows skipped)':>22} {'keyset cursor':>14} {'OFFSET':>10}")
            for fraction in (0.0, 0.5, 0.99):
                skip = int(args.results * fraction)
                cursor = newest - skip + 1 if skip else None
                keyset = timed(lambda c=cursor: page(session, ResultFilter(), args.limit, c), args.repeat)
                offset = timed(lambda k=skip: offset_page(session, args.limit, k), args.repeat)
                print(f"{skip:>22} {keyset:>14.1f} {offset:>10.1f}")
            filtered = ResultFilter(chip=["Apple M2"], revision=["rev1"])
            ms = timed(lambda: page(session, filtered, args.limit, None), args.repeat)
            got = len(page(session, filtered, args.limit, None)[0])
            print(f"filtered (chip=Apple M2, revision=rev1), first page: {ms:.1f} ms, {got} rows")
        engine.dispose()
    finally:
        cleanup()


if __name__ == "__main__":
    main()
