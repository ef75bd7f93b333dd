"""Triage through the real coordinator (SQLite and, with KERNELFLEET_TEST_POSTGRES_URL, PostgreSQL):
alerts raised by the detector from imported runs are marked invalid, ignored, fixed and open again,
acknowledged, grouped and ungrouped by hand, with who did it and when in each alert and its history;
a series' own threshold keeps the online detector quiet where the settings' would alert; bad input
gets 404, 409 or 422 in JSON; the dashboard and the admin CLI show the same. Then the engine's scan,
called directly: a per-series threshold changes what it finds, and a group set by hand survives its
re-placement of the alert."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from inproc import run_cli
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from test_regressions_api import CHIP, make_report

from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.models import Regression, RegressionStatus, SeriesThreshold
from kernelfleet.service.regressions import engine
from kernelfleet.service.regressions.attribution import attribute
from kernelfleet.service.regressions.series import SeriesKey, load_runs
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings

A, B, C = "4096x4096", "1024x4096", "2048x4096"  # A and B regress with MLX 0.32.4; C has its own threshold


def _import(admin: httpx.Client, reports: list[dict[str, Any]]) -> list[int]:
    r = admin.post("/results/import", json={"reports": reports})
    assert r.status_code == 201, r.text
    return r.json()["result_ids"]  # type: ignore[no-any-return]


def _open_alerts(coordinator: Any, want: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The regressions once ``want`` of them are open: confirmed on the runs stored after them (no
    worker of the chip re-runs them; the confirmation wait is 0 s in this coordinator)."""
    deadline = time.monotonic() + timeout
    with coordinator.client() as anon:
        while True:
            rows = anon.get("/regressions").json()
            if sum(r["status"] == "open" for r in rows) >= want:
                return rows  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)


def _mark(client: httpx.Client, regression_id: int, status: str, **more: Any) -> httpx.Response:
    return client.post(f"/regressions/{regression_id}/triage", json={"status": status, **more})


def _group(client: httpx.Client, regression_id: int, **body: Any) -> httpx.Response:
    return client.post(f"/regressions/{regression_id}/group", json=body)


def _error(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json") and words in r.json()["detail"], r.text


def test_triage_grouping_thresholds_history_dashboard_and_cli(coordinator_factory: Any) -> None:
    coordinator = coordinator_factory(KERNELFLEET_REGRESSION_CONFIRM_WAIT_SECONDS="0")
    rng = np.random.default_rng(31)
    flat = [100.0 * (1 + 0.004 * np.sin(i)) for i in range(8)]
    with coordinator.admin() as admin:
        _import(admin, [make_report(s, m, rng=rng) for s in (A, B, C) for m in flat])
        series = {"chip": CHIP, "kernel": "rmsnorm", "dtype": "float16"}
        # C's own minimum effect: +20 % is below it
        r = admin.put("/regressions/thresholds", json={**series, "shape": C, "min_effect": 0.5, "note": "x"})
        assert r.status_code == 200, r.text
        threshold = r.json()
        assert threshold["min_effect"] == 0.5 and threshold["set_by"] == "admin" and threshold["set_at"]
        _error(admin.put("/regressions/thresholds", json={**series, "shape": "1x1", "min_effect": 0.5}),
               404, "no run of rmsnorm 1x1")
        _error(admin.put("/regressions/thresholds", json={**series, "shape": C, "min_effect": 0}), 422,
               "min_effect")
        slow = {s: _import(admin, [make_report(s, 120.0 * (1 + 0.003 * i), rng=rng, mlx="0.32.4")
                                   for i in range(4)]) for s in (A, B, C)}
    rows = _open_alerts(coordinator, 2)
    coordinator.settle()
    by_shape = {r["shape"]: r for r in rows}
    assert set(by_shape) == {A, B}, rows  # C's +20 % is under its own threshold: no alert
    a, b = by_shape[A], by_shape[B]
    assert a["group_key"] == b["group_key"] == "mlx_version=0.32.3->0.32.4" and a["group_size"] == 2
    assert a["status_changed_by"] is None and a["result_id"] == slow[A][0]

    with coordinator.admin() as admin:
        token = admin.post("/tokens", json={"name": "alice", "scope": "admin"}).json()
        reader = admin.post("/tokens", json={"name": "viewer", "scope": "read"}).json()
    alice = coordinator.client(token["token"])
    with alice, coordinator.admin() as admin, coordinator.client(reader["token"]) as viewer:
        assert _mark(viewer, a["id"], "invalid").status_code == 403
        r = _mark(alice, a["id"], "invalid", note="a noisy host")
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["status"] == "invalid" and got["status_note"] == "a noisy host"
        assert got["status_changed_by"] == f"token {token['id']} (alice)" and got["status_changed_at"]
        _error(_mark(alice, a["id"], "invalid"), 409, "already invalid")
        _error(alice.post(f"/regressions/{a['id']}/acknowledge", json={}), 409, "is invalid")
        _error(_mark(alice, 999999, "ignored"), 404, "no regression 999999")
        _error(_mark(alice, a["id"], "dismissed"), 422, "status")
        _error(_mark(alice, a["id"], "fixed"), 422, "fixed needs fixed_by_regression_id or")
        _error(_mark(alice, a["id"], "fixed", fixed_by_result_id=1, whole_group=True), 422, "whole_group")
        _error(_mark(alice, a["id"], "ignored", fixed_by_result_id=1), 422, "go with status fixed only")
        _error(_mark(alice, a["id"], "fixed", fixed_by_result_id=9999), 404, "no run 9999")
        _error(_mark(alice, a["id"], "fixed", fixed_by_regression_id=999999), 404, "no regression 999999")
        _error(_mark(alice, a["id"], "fixed", fixed_by_regression_id=b["id"]), 422, "not a later change")
        for earlier_or_elsewhere in (slow[A][0] - 1, slow[B][-1]):
            _error(_mark(alice, a["id"], "fixed", fixed_by_result_id=earlier_or_elsewhere), 422,
                   "not a later run of the same series")
        # the fix: A back at its old level, the run that shows it linked
        [back] = _import(admin, [make_report(A, 100.0, rng=rng, mlx="0.32.5")])
        r = _mark(alice, a["id"], "fixed", fixed_by_result_id=back, note="MLX 0.32.5")
        assert r.status_code == 200 and r.json()["fixed_by_result_id"] == back, r.text
        assert r.json()["changed"] == [a["id"]] and r.json()["cancelled_jobs"] == []

        # B: ignored (expected), open again, then acknowledged by the admin token
        assert _mark(admin, b["id"], "ignored").json()["status"] == "ignored"
        assert _mark(admin, b["id"], "open").json()["status"] == "open"
        r = admin.post(f"/regressions/{b['id']}/acknowledge", json={"note": "tracked upstream"})
        assert r.status_code == 200 and r.json()["acknowledged"] == [b["id"]], r.text
        got = admin.get(f"/regressions/{b['id']}").json()
        assert (got["status"], got["status_changed_by"], got["acknowledged_note"]) == (
            "acknowledged", "admin", "tracked upstream")

        # grouping by hand: A out of the MLX group, then into B's again
        r = _group(alice, a["id"], into=None, note="a separate cause")
        assert r.status_code == 200, r.text
        assert r.json()["group_key"] == f"manual={a['id']}" and r.json()["group_size"] == 1
        alice_is = f"token {token['id']} (alice)"
        assert r.json()["group_note"] == f"moved out of its group by {alice_is}: a separate cause"
        assert admin.get(f"/regressions/{b['id']}").json()["group_size"] == 1
        _error(_group(alice, a["id"], into=None), 409, "alone in its group")
        _error(_group(alice, a["id"], into=a["id"]), 422, "another regression")
        _error(_group(alice, a["id"], into=999999), 404, "no regression 999999")
        _error(_group(alice, a["id"]), 422, "into")
        r = _group(alice, a["id"], into=b["id"])
        assert r.json()["group_key"] == b["group_key"] and r.json()["group_size"] == 2, r.text
        _error(_group(alice, a["id"], into=b["id"]), 409, "already")

        history = admin.get(f"/regressions/{a['id']}/history").json()
        assert [(e["action"], e["old"], e["new"]) for e in history] == [
            ("status", "open", "invalid"), ("status", "invalid", "fixed"),
            ("group", "mlx_version=0.32.3->0.32.4", f"manual={a['id']}"),
            ("group", f"manual={a['id']}", "mlx_version=0.32.3->0.32.4")]
        assert {e["actor"] for e in history} == {f"token {token['id']} (alice)"}
        assert history[1]["detail"] == {"fixed_by_result_id": back} and history[1]["at"] >= history[0]["at"]
        b_history = admin.get(f"/regressions/{b['id']}/history").json()
        assert [(e["old"], e["new"], e["actor"]) for e in b_history] == [
            ("open", "ignored", "admin"), ("ignored", "open", "admin"), ("open", "acknowledged", "admin")]
        _error(admin.get("/regressions/999999/history"), 404, "no regression 999999")
        assert [r["id"] for r in admin.get("/regressions", params={"status": "fixed"}).json()] == [a["id"]]

        # thresholds: listed, replaced in place, removed
        [listed] = admin.get("/regressions/thresholds").json()
        assert listed == threshold
        r = alice.put("/regressions/thresholds", json={**series, "shape": C, "min_effect": 0.4})
        assert (r.json()["id"], r.json()["min_effect"], r.json()["note"]) == (threshold["id"], 0.4, None)
        assert r.json()["set_by"] == f"token {token['id']} (alice)"
        assert admin.delete(f"/regressions/thresholds/{threshold['id']}").json()["shape"] == C
        _error(admin.delete(f"/regressions/thresholds/{threshold['id']}"), 404, "no threshold")
        assert admin.get("/regressions/thresholds").json() == []

    # the dashboard: each alert's status, who changed it and when; the history on its own page
    listing = httpx.get(coordinator.url + "/regressions", params={"status": "all"}, timeout=30).text
    assert 'data-status="fixed"' in listing and f"token {token['id']} (alice)" in listing
    assert f'href="/runs/{back}"' in listing and "tracked upstream" in listing
    fixed_only = httpx.get(coordinator.url + "/regressions", params={"status": "fixed"}, timeout=30).text
    assert f'id="regression-{a["id"]}"' in fixed_only and f'id="regression-{b["id"]}"' not in fixed_only
    page = httpx.get(coordinator.url + f"/regressions/{a['id']}", timeout=30).text
    assert page.count('<tr class="event"') == 4 and "a separate cause" in page

    # the admin CLI: the same actions over the API
    cli = ("--coordinator", coordinator.url, "--admin-token", coordinator.admin_token)
    done = run_cli("admin", "regressions", "mark", str(b["id"]), "fixed", "--fixed-by-run", str(back), *cli)
    assert done.exit_code == 1 and "not a later run of the same series" in done.output  # A's run, not B's
    # the whole group (A joined B's above): A fixed and B acknowledged, both ignored now
    done = run_cli("admin", "regressions", "mark", str(b["id"]), "ignored", "--group", "--note", "x", *cli)
    both = ", ".join(str(i) for i in sorted((a["id"], b["id"])))
    assert done.exit_code == 0 and f"regressions {both}: ignored (by admin)" in done.output, done.output
    with coordinator.client() as anon:
        assert anon.get(f"/regressions/{a['id']}").json()["status"] == "ignored"
    done = run_cli("admin", "regressions", "ungroup", str(b["id"]), *cli)
    assert done.exit_code == 0 and f"manual={b['id']}" in done.output, done.output
    done = run_cli("admin", "regressions", "history", str(b["id"]), "--json", *cli)
    assert [e["new"] for e in json.loads(done.output)][-2:] == ["ignored", f"manual={b['id']}"]
    done = run_cli("admin", "regressions", "threshold", "set", "--chip", CHIP, "--kernel", "rmsnorm",
                   "--shape", C, "--dtype", "float16", "--min-effect", "0.08", *cli)
    assert done.exit_code == 0 and "8.0 %" in done.output, done.output
    done = run_cli("admin", "regressions", "threshold", "list", *cli)
    assert C in done.output and "admin" in done.output, done.output


@pytest.fixture
def factory(migrated_db_url: str) -> Iterator[sessionmaker[Session]]:
    db = make_engine(migrated_db_url)
    yield make_sessionmaker(db)
    db.dispose()


def test_scan_takes_the_series_threshold_and_keeps_a_group_set_by_hand(
    factory: sessionmaker[Session], migrated_db_url: str
) -> None:
    # one series +8 % from run 12 (the MLX upgrade)
    rng = np.random.default_rng(7)
    ids = []
    with factory() as session, immediate(session):
        for i in range(24):
            level = (100.0 if i < 12 else 108.0) * float(np.exp(rng.normal(0, 0.003)))
            report = make_report(A, level, rng=rng, mlx="0.32.4" if i >= 12 else "0.32.3")
            ids.append(store_report(session, TuningReport.model_validate(report), source="import").id)
        session.add(SeriesThreshold(chip=CHIP, kernel="rmsnorm", shape=A, dtype="float16", min_effect=0.12,
                                    set_by="admin"))
    settings = Settings(database_url=migrated_db_url)
    assert engine.scan(factory, settings).created == []  # +8 % is below the series' 12 %
    with factory() as session, immediate(session):
        session.execute(SeriesThreshold.__table__.delete())
        # an alert a person grouped by hand, standing two runs early
        runs = load_runs(session, SeriesKey(CHIP, "rmsnorm", A, "float16"))
        session.add(Regression(
            group_key="manual=1", group_note="moved out of its group by admin", kernel="rmsnorm", shape=A,
            dtype="float16", chip=CHIP, config_key="tg=256,vec=4", status=RegressionStatus.open,
            detector="step",
            baseline_median_us=100.0, new_median_us=108.0, effect=0.08, p_value=1e-4,
            cause=attribute(runs[9], runs[10]), baseline_result_id=ids[9], result_id=ids[10]))
    report = engine.scan(factory, settings)  # the settings' 3 %: the step is found, and it is this alert's
    with factory() as session:
        [reg] = session.scalars(select(Regression)).all()
    assert report.created == [] and report.moved == [reg.id]
    assert (reg.result_id, reg.cause) == (ids[12], {"mlx_version": ["0.32.3", "0.32.4"]})
    assert reg.group_key == "manual=1"  # moved to its run pair, its group kept
