"""The CPU one stored report costs the coordinator (``reports.store_report``: the result row, its trials,
the series statistics), without HTTP, on PostgreSQL (a fresh database ``kf_store_cost`` on the server) or a
SQLite file: the fleet run's reports (``results/h100_fleet_tuning.jsonl``), each a new series (its shape
renamed), as the realistic load scenario sends them. Prints the CPU per report, unprofiled, of this process
and of the host's PostgreSQL server processes (from /proc, where they run here), then the same under
cProfile with its top functions by cumulative time.

    python benchmarks/store_report_cost.py --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "benchmarks" / "results" / "h100_fleet_tuning.jsonl"


def database(postgres: str | None) -> str:
    """A fresh, migrated database: ``kf_store_cost`` on the PostgreSQL server at ``postgres``, else a
    SQLite file in a temporary folder."""
    if postgres:
        import psycopg

        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS kf_store_cost")
            conn.execute("CREATE DATABASE kf_store_cost")
        url = postgres.rsplit("/", 1)[0] + "/kf_store_cost"
    else:
        url = f"sqlite:///{tempfile.mkdtemp()}/kf.db"
    env = dict(os.environ, KERNELFLEET_DATABASE_URL=url)
    subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", "db", "upgrade"], env=env, check=True,
                   capture_output=True)
    return url


def postgres_cpu() -> float:
    """CPU seconds (user + system) of this host's processes named ``postgres``: 0 where there are none
    (or no /proc)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            if fields[0].endswith("(postgres"):
                utime, stime = fields[1].split()[11:13]
                total += (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--postgres", help="PostgreSQL server URL (a fresh database is made there); else SQLite")
    p.add_argument("--reports", type=int, default=200, help="reports stored per pass")
    p.add_argument("--top", type=int, default=25, help="cProfile's functions printed")
    args = p.parse_args(argv)
    from kernelfleet.service.db import make_engine, make_sessionmaker
    from kernelfleet.service.reports import store_report
    from kernelfleet.service.schemas import TuningReport

    sessions = make_sessionmaker(make_engine(database(args.postgres)))
    reports = [TuningReport.model_validate_json(line) for line in REPORTS.read_text().splitlines()]

    def store(i: int) -> None:
        r = reports[i % len(reports)]
        with sessions.begin() as session:
            store_report(session, r.model_copy(update={"shape": f"{i + 1}x{r.shape}"}))  # a new series

    for i in range(20):  # warm: compiled statements, prepared queries, pools
        store(10**6 + i)
    n = args.reports
    t, server = time.process_time(), postgres_cpu()
    for i in range(n):
        store(i)
    line = f"{n} reports: {1e3 * (time.process_time() - t) / n:.2f} ms of CPU a report"
    if args.postgres:
        line += f", and {1e3 * (postgres_cpu() - server) / n:.2f} ms of the host's PostgreSQL processes'"
    print(line)
    profile = cProfile.Profile()
    profile.enable()
    for i in range(n, 2 * n):
        store(i)
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
