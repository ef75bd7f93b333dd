"""The CPU one stored report costs the coordinator (``reports.store_report``: the result row, its trials,
the series statistics), without HTTP, on PostgreSQL (a fresh database on the server, dropped after) or a
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordinator_load import (  # noqa: E402  (the benchmarks' own helpers: databases, /proc CPU)
    FLEET_REPORTS,
    cpu_seconds,
    cpu_used,
    drop_database,
    fresh_database,
    postgres_pids,
)


def postgres_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each of this host's PostgreSQL processes, from /proc."""
    return cpu_seconds(postgres_pids())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--postgres", help="PostgreSQL server URL (a fresh database is made there); else SQLite")
    p.add_argument("--reports", type=int, default=200, help="reports stored per pass")
    p.add_argument("--top", type=int, default=25, help="cProfile's functions printed")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp())
    url, name = fresh_database(args, workdir)
    try:
        subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", "db", "upgrade"],
                       env=dict(os.environ, KERNELFLEET_DATABASE_URL=url), check=True, capture_output=True)
        measure(url, args)
    finally:
        drop_database(args, name)
    return 0


def measure(url: str, args: argparse.Namespace) -> None:
    """Store ``--reports`` reports timed, then as many under cProfile, and print both."""
    from kernelfleet.service.db import make_engine, make_sessionmaker
    from kernelfleet.service.reports import store_report
    from kernelfleet.service.schemas import TuningReport

    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    reports = [TuningReport.model_validate_json(line) for line in FLEET_REPORTS.read_text().splitlines()]

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
        used = cpu_used(server, postgres_cpu())
        line += f", and {1e3 * used / n:.2f} ms of the host's PostgreSQL processes'"
    print(line)
    profile = cProfile.Profile()
    profile.enable()
    for i in range(n, 2 * n):
        store(i)
    profile.disable()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    engine.dispose()  # before the database is dropped


if __name__ == "__main__":
    sys.exit(main())
