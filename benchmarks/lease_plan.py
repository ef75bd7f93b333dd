"""The lease statement's PostgreSQL plan with 100,000 queued jobs: O(log n), not a scan.

Makes a fresh database, queues ``--jobs`` jobs over ``--targets`` targets (the oldest ones for a
chip the leasing worker is not, so a pick that filters while scanning in queue order would read them
all), then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the exact lease ``UPDATE`` the coordinator runs
(rolled back), and, for comparison, of the ``SELECT DISTINCT target_chip`` over queued jobs that
every lease used to run first.

    python benchmarks/lease_plan.py --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg
from sqlalchemy import insert, select, text
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
        engine.dispose()
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
