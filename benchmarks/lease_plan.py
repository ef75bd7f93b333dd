"""The lease statement's PostgreSQL plan with 100,000 queued jobs: O(log n), not a scan.

Makes a fresh database, queues ``--jobs`` jobs over ``--targets`` targets (the oldest ones for a
chip the leasing worker is not, so a pick that filters while scanning in queue order would read them
all), then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the exact lease ``UPDATE`` the coordinator runs
(rolled back), and, for comparison, of the ``SELECT DISTINCT target_chip`` over queued jobs that
every lease used to run first.

``--drain N`` then leases N of the worker's jobs one after another, each committed as the coordinator
commits it, and prints the statement's time per block of leases and its plan again after them: what a
fleet's start-up burst (every worker's first lease within the ramp) does to the next lease, with every
row it leased still in the queue's index until vacuum reclaims it.

    python benchmarks/lease_plan.py --postgres postgresql://postgres@127.0.0.1:5432/test
    python benchmarks/lease_plan.py --postgres ... --jobs 24000 --targets 8 --drain 2500
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg
from sqlalchemy import Engine, insert, select, text
from sqlalchemy.dialects import postgresql

from kernelfleet.service import leasing
from kernelfleet.service.db import make_engine, make_sessionmaker
from kernelfleet.service.models import Backend, Job, JobState, Worker
from kernelfleet.service.targets import runnable_targets, target_id


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--postgres", required=True, help="PostgreSQL server URL (a fresh database is made there)")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--targets", type=int, default=10)
    p.add_argument("--drain", type=int, default=0, metavar="N",
                   help="then lease N of the worker's jobs one after another, timed per block, and show the "
                        "plan again")
    p.add_argument("--block", type=int, default=250, help="--drain: leases a timed block")
    args = p.parse_args()
    name = "kf_plan_" + secrets.token_hex(4)
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = args.postgres.rsplit("/", 1)[0] + "/" + name
    try:
        subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", "db", "upgrade",
                        "--database-url", url], check=True, capture_output=True)
        engine = make_engine(url)
        factory = make_sessionmaker(engine)
        chips = [f"Apple M{i} Max" for i in range(1, args.targets)] + ["NVIDIA H100*"]
        start = datetime.now(UTC) - timedelta(days=1)
        with factory() as session, session.begin():
            targets = [target_id(session, Backend.cuda if c.startswith("NVIDIA") else Backend.metal, c)
                       for c in chips]
            per = args.jobs // len(chips)
            for t, chip in zip(targets, chips, strict=True):  # the H100 jobs are the newest
                backend = Backend.cuda if chip.startswith("NVIDIA") else Backend.metal
                session.execute(insert(Job), [
                    {"kind": "tune", "kernel": "rmsnorm", "shape": f"{i + 1}x4096", "dtype": "float16",
                     "target_backend": backend, "target_chip": chip, "target_id": t, "state": JobState.queued,
                     "attempts": 0, "max_attempts": 3,
                     "available_at": start + timedelta(milliseconds=targets.index(t) * per + i)}
                    for i in range(per)])
            worker = Worker(name="h100", token_digest="0" * 64, chip="NVIDIA H100 80GB HBM3",
                            backend=Backend.cuda, os="Linux", mlx_version="0.32.4")
            session.add(worker)
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
            conn.commit()
        with factory() as session:
            worker = session.scalars(select(Worker)).one()
            ids = runnable_targets(session, worker.backend, worker.chip)
            stmt = leasing.lease_statement(ids, worker.id, "0" * 64, 30.0)
            sql = str(stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        queued = per * len(chips)
        print(f"{queued} queued jobs over {len(chips)} targets; the worker ({worker.chip}) matches "
              f"target(s) {ids}, whose {per} jobs are the newest in the queue\n")
        with engine.connect() as conn:
            print("-- the lease statement:\n" + sql + "\n")
            for row in conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql)):
                print(row[0])
            conn.rollback()
            before = ("SELECT DISTINCT jobs.target_chip FROM jobs WHERE jobs.state = 'queued' "
                      "AND jobs.target_chip IS NOT NULL")
            print(f"\n-- before: every lease first ran\n{before}\n")
            for row in conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + before)):
                print(row[0])
        if args.drain:
            drain(engine, worker.id, worker.backend, worker.chip, sql, min(args.drain, per - 1), args.block)
        engine.dispose()
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drain(engine: Engine, worker_id: int, backend: Backend, chip: str, sql: str, n: int, block: int) -> None:
    """Lease ``n`` jobs back to back through :func:`leasing.lease_next` (one autocommitted statement
    each, as a lease request runs it), printing the median and max time of each block, then the plan of
    the next lease (rolled back) and the jobs table's dead rows."""
    print(f"\n-- {n} leases one after another (each committed), ms a lease by blocks of {block}:")
    times: list[float] = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for i in range(n):
            t0 = time.perf_counter()
            got = leasing.lease_next(conn, worker_id, backend, chip, 300.0)
            times.append(time.perf_counter() - t0)
            if got is None:
                print(f"   the queue ran dry after {i} leases")
                break
            if len(times) % block == 0:
                part = times[-block:]
                print(f"   leases {len(times) - block + 1:6d}-{len(times):6d}: median "
                      f"{statistics.median(part) * 1e3:7.3f}  max {max(part) * 1e3:7.3f}")
    with engine.connect() as conn:
        print(f"\n-- the lease statement after {len(times)} leases:")
        for row in conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql)):
            print(row[0])
        conn.rollback()
        dead = conn.execute(text("SELECT n_live_tup, n_dead_tup, last_autovacuum FROM pg_stat_user_tables "
                                 "WHERE relname = 'jobs'")).one()
        print(f"\njobs: {dead.n_live_tup} live rows, {dead.n_dead_tup} dead, last autovacuum "
              f"{dead.last_autovacuum}")


if __name__ == "__main__":
    main()
