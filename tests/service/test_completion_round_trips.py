"""A worker's result request costs a handful of database round trips (issue 33: with the database
5 ms away, each statement is 5 ms of the request): every statement the coordinator runs for one
``POST /jobs/{id}/result`` is counted with SQLAlchemy's ``before_cursor_execute`` on the served app's
engine, with its transactions and the pool's pings, so that the count cannot creep back.

On PostgreSQL: the worker's token check (its last-seen time refreshed in a CTE of the same
statement), the job's transition, the result row, its trials and its stats rows (an executemany
each), and the profile request carrying the event and the stored response; one BEGIN and one COMMIT,
no ping of a connection in steady use: 8 round trips, where 12 or 13 were. On SQLite, in-process,
the writes run as statements of their own.

A heartbeat and a lease, what a fleet of long tunes and an idle fleet mostly send, run as Core
statements that authenticate inside themselves, in autocommit on PostgreSQL: a heartbeat is one
statement (the lease extended, the worker's last-seen time refreshed in a CTE of it), a lease two (the
token check, which also counts the job targets, and the lease; the targets themselves are read again
only when their number changed), where they were 4 and 5 round trips in a transaction."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
import pytest
from coordinator_helpers import make_report
from inproc import fast_settings, serve_in_thread
from sqlalchemy import event, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from kernelfleet.service import auth_first, db
from kernelfleet.service.models import Worker
from kernelfleet.service.settings import Settings

ADMIN = {"Authorization": "Bearer kfa_test-admin"}


class Counted:
    """The statements (their first word) and the transaction events of ``engine``, and its pings."""

    def __init__(self, engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        self.events: Counter[str] = Counter()
        self.on = False
        event.listen(engine, "before_cursor_execute", self._statement)
        for name in ("begin", "commit", "rollback"):
            event.listen(engine, name, lambda _conn, name=name: self._event(name))
        ping = engine.dialect.do_ping

        def counted_ping(dbapi_connection: Any) -> bool:
            self._event("ping")
            return bool(ping(dbapi_connection))

        monkeypatch.setattr(engine.dialect, "do_ping", counted_ping)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.on:
            self.statements.append(statement.split(None, 1)[0].upper())

    def _event(self, name: str) -> None:
        if self.on:
            self.events[name] += 1

    def start(self) -> None:
        self.statements.clear()
        self.events.clear()
        self.on = True


def _worker(c: httpx.Client) -> tuple[int, dict[str, str]]:
    assert c.post("/api/v1/campaigns", headers=ADMIN, json={
        "name": "c", "kernels": ["rmsnorm"], "shapes": ["1x4096", "2x4096"], "dtypes": ["float16"]}
    ).status_code == 201
    enroll = c.post("/api/v1/enroll-tokens", headers=ADMIN, json={}).json()["token"]
    w = c.post("/api/v1/workers/enroll", json={
        "enrollment_token": enroll, "name": "w", "chip": "NVIDIA H100 80GB HBM3", "backend": "cuda",
        "os": "Linux 6.1", "mlx_version": "0.32.4"}).json()
    return int(w["worker_id"]), {"Authorization": f"Bearer {w['token']}"}


def _lease(c: httpx.Client, auth: dict[str, str]) -> dict[str, Any]:
    got = c.post("/api/v1/leases", json={}, headers=auth).json()
    assert c.post(f"/api/v1/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]},
                  headers=auth).status_code == 200
    return dict(got)


def _result(c: httpx.Client, auth: dict[str, str], got: dict[str, Any]) -> httpx.Response:
    report = make_report(kernel=got["kernel"], shape=got["shape"], dtype=got["dtype"])
    return c.post(f"/api/v1/jobs/{got['job_id']}/result", json={"lease_token": got["lease_token"],
                                                                "report": report}, headers=auth)


@contextmanager
def _counted_worker(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """(client, engine, its counted statements, worker id, worker auth) on a served app whose workers'
    last-seen time is refreshed when over 0.1 s old (a tenth of the offline threshold)."""
    settings = fast_settings(url, background_in_server=False, reaper_interval_seconds=3600,
                             worker_offline_after_seconds=1.0)
    with serve_in_thread(settings) as (base, app), httpx.Client(base_url=base, timeout=30) as c:
        engine = app.state.engine
        counted = Counted(engine, monkeypatch)
        yield (c, engine, counted, *_worker(c))


def _last_seen(engine: Any, worker_id: int) -> Any:
    with engine.connect() as conn:
        return conn.scalar(select(Worker.last_heartbeat_at).where(Worker.id == worker_id))


def test_a_result_request_costs_a_handful_of_round_trips(migrated_db_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    sqlite = db.is_sqlite(migrated_db_url)
    with _counted_worker(migrated_db_url, monkeypatch) as (c, engine, counted, worker_id, auth):
        got = _lease(c, auth)
        seen = _last_seen(engine, worker_id)
        time.sleep(0.3)  # the last-seen time is stale: this request refreshes it
        counted.start()
        r = _result(c, auth, got)
        counted.on = False
        assert r.status_code == 201, r.text
        # the token check (on SQLite, and its last-seen refresh), the job's transition, the result,
        # its trials, its stats rows, then the profile request, the event and the stored response
        # (one statement on PostgreSQL); one transaction (SQLite's BEGIN IMMEDIATE is a statement)
        core = ["UPDATE", "INSERT", "INSERT", "INSERT"]
        assert counted.statements == (["BEGIN", "SELECT", "UPDATE", *core, "INSERT", "INSERT", "UPDATE"]
                                      if sqlite else ["WITH", *core, "WITH"]), counted.statements
        assert counted.events == {"begin": 1, "commit": 1}, counted.events  # no ping
        assert _last_seen(engine, worker_id) > seen
        # a replay: the token check (stale again), the transition that finds the job done, the result
        time.sleep(0.3)
        counted.start()
        replay = _result(c, auth, got)
        counted.on = False
        assert replay.status_code == 200 and replay.json() == r.json()
        assert counted.statements == (["BEGIN", "SELECT", "UPDATE", "UPDATE", "SELECT"] if sqlite else
                                      ["WITH", "UPDATE", "SELECT"]), counted.statements


def test_a_heartbeat_is_one_statement_and_a_lease_two(migrated_db_url: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sqlite = db.is_sqlite(migrated_db_url)
    with _counted_worker(migrated_db_url, monkeypatch) as (c, engine, counted, worker_id, auth):
        c.post("/api/v1/leases", json={}, headers=auth)  # the pool's first connection made and pinged
        time.sleep(0.3)  # the last-seen time is stale: the lease refreshes it
        counted.start()
        got = c.post("/api/v1/leases", json={}, headers=auth).json()
        counted.on = False
        assert got["job_id"]
        # the token check (with the number of job targets, as many as the process read before), the lease
        assert counted.statements == (["BEGIN", "SELECT", "UPDATE", "UPDATE"] if sqlite else
                                      ["WITH", "UPDATE"]), counted.statements
        # one transaction on SQLite; none on PostgreSQL (each statement commits on its own), no ping
        assert counted.events["commit"] == (1 if sqlite else 0) and not counted.events["ping"], counted.events
        seen = _last_seen(engine, worker_id)
        time.sleep(0.3)
        counted.start()
        beat = c.post(f"/api/v1/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]},
                      headers=auth)
        counted.on = False
        assert beat.status_code == 200, beat.text
        # the lease extended and the worker's last-seen time refreshed: one statement on PostgreSQL
        wanted = ["BEGIN", "UPDATE", "UPDATE"] if sqlite else ["WITH"]
        assert counted.statements == wanted, counted.statements
        assert not counted.events["ping"]
        assert _last_seen(engine, worker_id) > seen
        # a stale lease token changes nothing and gets the worker transaction's 409, a bad worker token 401
        stale = c.post(f"/api/v1/jobs/{got['job_id']}/heartbeat", json={"lease_token": "kfl_stale"},
                       headers=auth)
        assert stale.status_code == 409, stale.text
        bad = c.post(f"/api/v1/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]},
                     headers={"Authorization": "Bearer kfw_nobody"})
        assert bad.status_code == 401, bad.text


def test_the_body_first_token_check_is_one_statement(migrated_db_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A token the auth-first middleware does not remember is looked up in one statement over workers
    and API tokens (no ORM session, no transaction of its own on PostgreSQL), and once found it is
    remembered longer than a worker waits between heartbeats (a third of the lease at most)."""
    with _counted_worker(migrated_db_url, monkeypatch) as (c, engine, counted, _worker_id, auth):
        minted = c.post("/api/v1/tokens", headers=ADMIN, json={"name": "reader", "scope": "read"})
        assert minted.status_code == 201, minted.text
        factory = sessionmaker(bind=engine)
        worker_token = auth["Authorization"].split(" ", 1)[1]
        for token, known in ((worker_token, True), (minted.json()["token"], True), ("kfw_nobody", False)):
            counted.start()
            assert auth_first._known(factory, token) is known
            counted.on = False
            assert counted.statements == (["BEGIN", "SELECT"] if db.is_sqlite(migrated_db_url) else
                                          ["SELECT"]), counted.statements
            assert not counted.events["commit"] and not counted.events["ping"], counted.events


class _Later:
    """``time`` for the auth-first middleware, ``shift`` seconds ahead."""

    def __init__(self) -> None:
        self.shift = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.shift


def test_a_heartbeat_a_third_of_a_long_lease_later_costs_no_token_lookup(
        migrated_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet on 300 s leases beats every 60-100 s (a third of the lease, less the jitter): the
    auth-first middleware still remembers the token then, so the heartbeat stays one statement."""
    later = _Later()
    monkeypatch.setattr(auth_first, "time", later)
    sqlite = db.is_sqlite(migrated_db_url)
    with _counted_worker(migrated_db_url, monkeypatch) as (c, _engine, counted, _worker_id, auth):
        got = _lease(c, auth)
        for shift in (100.0, 1000.0):  # the longest heartbeat interval of 300 s leases, and more
            later.shift = shift
            counted.start()
            beat = c.post(f"/api/v1/jobs/{got['job_id']}/heartbeat",
                          json={"lease_token": got["lease_token"]}, headers=auth)
            counted.on = False
            assert beat.status_code == 200, beat.text
            # the lease extended (on SQLite, then the worker's last-seen time): no SELECT of the token
            assert counted.statements == (["BEGIN", "UPDATE", "UPDATE"] if sqlite else ["WITH"]), \
                counted.statements
            assert Settings(lease_seconds=300).lease_seconds / 3 <= shift < auth_first.KNOWN_SECONDS


@pytest.mark.postgres
def test_an_idle_connection_is_pinged_and_a_dead_one_replaced(migrated_db_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections that sat in the pool over PING_IDLE_SECONDS are pinged before use: the database's
    connections cut while the coordinator idles, its next request still succeeds."""
    if db.is_sqlite(migrated_db_url):
        pytest.skip("PostgreSQL: SQLite has no connection to lose")
    settings = fast_settings(migrated_db_url, background_in_server=False, reaper_interval_seconds=3600)
    with serve_in_thread(settings) as (url, app), httpx.Client(base_url=url, timeout=30) as c:
        counted = Counted(app.state.engine, monkeypatch)
        _, auth = _worker(c)
        got = _lease(c, auth)
        name = make_url(migrated_db_url).database
        admin = make_url(migrated_db_url).set(drivername="postgresql", database="postgres")
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        monkeypatch.setattr(db, "PING_IDLE_SECONDS", 0.0)  # every pooled connection counts as idle
        counted.start()
        r = _result(c, auth, got)
        counted.on = False
        assert r.status_code == 201, r.text
        assert counted.events["ping"] >= 1, counted.events
