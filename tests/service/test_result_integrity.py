"""Integrity of stored results: a worker reports only for the chip it enrolled as, import is
idempotent and keeps the worker's ``measured_at``, and the repository's own committed reports import.
Each runs on SQLite and, when configured, PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll, lease, make_report
from inproc import run_cli
from sampling import covered, rotating
from sqlalchemy import func, select

from kernelfleet.service.db import make_engine, make_sessionmaker, stored_utc
from kernelfleet.service.import_cli import read_reports
from kernelfleet.service.models import ConfigStat, Result, Trial
from kernelfleet.web.series import run_points

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _scalar(coordinator: Coordinator, query: Any) -> Any:
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            return conn.scalar(query)
    finally:
        engine.dispose()


def test_a_report_for_another_chip_is_refused_and_not_stored(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, token = enroll(coordinator, chip="AMD EPYC 7763 64-Core Processor", backend="cpu")
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        url = f"/jobs/{got['job_id']}/result"
        spoofed = make_report(chip="Apple M3 Max", backend="metal")
        r = c.post(url, json={"lease_token": got["lease_token"], "report": spoofed})
        assert r.status_code == 422, r.text
        assert "enrolled as 'AMD EPYC 7763 64-Core Processor' (cpu)" in r.json()["detail"]
        # the backend alone differing is refused too
        cpu_chip_wrong_backend = make_report(chip="AMD EPYC 7763 64-Core Processor", backend="cuda")
        r = c.post(url, json={"lease_token": got["lease_token"], "report": cpu_chip_wrong_backend})
        assert r.status_code == 422, r.text
        # the lease is intact: the honest report is accepted
        honest = make_report(chip="AMD EPYC 7763 64-Core Processor", backend="cpu")
        r = c.post(url, json={"lease_token": got["lease_token"], "report": honest})
        assert r.status_code == 201, r.text
    assert _scalar(coordinator, select(func.count()).select_from(Result)) == 1
    assert _scalar(coordinator, select(func.count()).where(Result.chip == "Apple M3 Max")) == 0
    assert _scalar(coordinator, select(func.count()).where(ConfigStat.chip == "Apple M3 Max")) == 0


def test_import_is_idempotent_and_keeps_measured_at(coordinator: Coordinator) -> None:
    dated = {**make_report(shape="1024x4096"), "measured_at": "2026-03-01T10:20:30+00:00"}
    undated = make_report(shape="2048x4096")
    with coordinator.admin() as admin:
        first = admin.post("/results/import", json={"reports": [dated, undated]})
        assert first.status_code == 201, first.text
        assert first.json()["imported"] == 2 and first.json()["duplicates"] == 0
        # the same reports again, and one of them twice within one request: nothing new is stored
        again = admin.post("/results/import", json={"reports": [undated, dated, dated]})
        assert again.status_code == 201, again.text
        ids = first.json()["result_ids"]
        assert again.json() == {"imported": 0, "duplicates": 3, "result_ids": [ids[1], ids[0], ids[0]]}
    assert _scalar(coordinator, select(func.count()).select_from(Result)) == 2
    # the stats count each run once
    assert _scalar(coordinator, select(func.max(ConfigStat.runs))) == 1
    measured = _scalar(coordinator, select(Result.measured_at).where(Result.id == ids[0]))
    measured = measured if measured.tzinfo else measured.replace(tzinfo=UTC)
    assert measured == datetime(2026, 3, 1, 10, 20, 30, tzinfo=UTC)
    # an older report without measured_at imports, marked undated (NULL), dated only by its import
    assert _scalar(coordinator, select(Result.measured_at).where(Result.id == ids[1])) is None
    # and the stats' last-seen time is the worker's clock, not the import's
    seen = _scalar(coordinator, select(func.min(ConfigStat.first_seen_at)))
    seen = seen if seen.tzinfo else seen.replace(tzinfo=UTC)
    assert seen == datetime(2026, 3, 1, 10, 20, 30, tzinfo=UTC)
    # the dashboard draws the dated run at its measurement, the undated one when it was stored
    engine = make_engine(coordinator.db_url)
    try:
        with make_sessionmaker(engine)() as session:
            points = run_points(session, dated["env"]["chip"], dated["kernel"], 10)
    finally:
        engine.dispose()
    by_id = {p.result_id: p for pts in points.values() for p in pts}
    assert by_id[ids[0]].at == datetime(2026, 3, 1, 10, 20, 30, tzinfo=UTC)
    assert by_id[ids[1]].at == stored_utc(by_id[ids[1]].created_at)


def test_a_shared_measurement_is_stored_and_shown_on_its_run(coordinator: Coordinator) -> None:
    """A Metal worker measures identical kernels once (the hint axis renders one source) and marks
    the others ``shares_measurement_with`` the one it measured: the coordinator keeps the mark, and
    the run page says which config's measurement a trial carries."""
    report = make_report(chip="Apple M2 Pro", backend="metal")
    twin = {**report["trials"][1], "config_key": "tg=256,vec=4,hint=2",
            "config": {"tg": 256, "vec": 4, "hint": 2}, "shares_measurement_with": "tg=256,vec=4"}
    report["trials"].append(twin)
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [report]})
        assert r.status_code == 201, r.text
        [result_id] = r.json()["result_ids"]
        page = admin.get(f"{coordinator.url}/runs/{result_id}")
    assert page.status_code == 200
    shared = _scalar(coordinator, select(Trial.shares_measurement_with)
                     .where(Trial.config_key == "tg=256,vec=4,hint=2"))
    assert shared == "tg=256,vec=4"
    assert _scalar(coordinator, select(func.count()).where(Trial.shares_measurement_with.is_not(None))) == 1
    row = page.text.split('data-config="tg=256,vec=4,hint=2"', 1)[1].split("</tr>", 1)[0]
    assert "measured as <code>tg=256,vec=4</code>" in row


def test_the_committed_reports_import(coordinator: Coordinator, tmp_path: Path) -> None:
    """Every committed ``benchmarks/results/*_tuning.jsonl`` reads and validates as ``kernelfleet import``
    reads it (older ones have no measured_at, some a null golden sample); a rotating sample of them,
    one of the older format among them, imports through the CLI (in-process), and importing one again
    stores nothing twice. (All of them under ``make test-full``: importing the 10 MB took 160 s a backend.)"""
    files = sorted(RESULTS.glob("*_tuning.jsonl"))
    assert len(files) >= 5
    for f in files:
        assert read_reports(f)
    oldest = [f for f in files if '"measured_at"' not in f.read_text()]
    assert oldest, "no committed report of the older format (no measured_at) left to import"
    picked = sorted(set(rotating(files, 2, "committed-reports") + rotating(oldest, 1, "oldest-reports")))
    print(covered("committed report files imported", len(picked), len(files)))
    env = {"KERNELFLEET_ADMIN_TOKEN": coordinator.admin_token}

    for rerun in (False, True):
        for f in picked if not rerun else picked[:1]:
            # in-process (click's runner); test_cli_wording runs `kernelfleet import` as a process
            done = run_cli("import", str(f), "--coordinator", coordinator.url, env=env)
            assert done.exit_code == 0, done.stderr
            if rerun:
                assert "imported 0 reports" in done.stdout and "already imported before" in done.stdout
    lines = sum(len([x for x in f.read_text().splitlines() if x.strip()]) for f in picked)
    distinct = len({json.dumps(json.loads(x), sort_keys=True) for f in picked
                    for x in f.read_text().splitlines() if x.strip()})
    assert distinct <= lines
    assert _scalar(coordinator, select(func.count()).select_from(Result)) == distinct
