"""benchmarks/store_report_cost.py on a SQLite file: it stores the fleet run's reports, each a new series, and
prints the CPU a report and the profile."""

from __future__ import annotations

import subprocess
import sys

from . import BENCHMARKS


def test_store_report_cost_stores_and_profiles() -> None:
    cmd = [sys.executable, str(BENCHMARKS / "store_report_cost.py"), "--reports", "5", "--top", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=BENCHMARKS.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "5 reports: " in r.stdout and " ms of CPU a report" in r.stdout
    assert "store_report" in r.stdout  # the profile's cumulative table names the function it measures
