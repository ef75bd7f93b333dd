"""A database that cannot be written or reached: ``/healthz`` says so (503), API calls answer JSON
``{"detail": ...}`` 503s, dashboard pages their HTML 503 page, and any other database error is a
JSON 500; never plain text or a traceback. Everything recovers once the database is back."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest
from conftest import POSTGRES_URL, Coordinator
from sqlalchemy.engine import make_url

from kernelfleet.service.db import is_sqlite

# serve's own start-up checks and its log, against a database that goes away
pytestmark = pytest.mark.coordinator_process


def _admin_sql(*statements: str) -> None:
    url = make_url(POSTGRES_URL or "").set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


@contextmanager
def unwritable(coordinator: Coordinator) -> Iterator[None]:
    """The coordinator restarted on a database it can read but not write: an immutable SQLite file
    (``chattr +i``: file modes do not stop root) or a PostgreSQL database whose sessions are read-only."""
    coordinator.stop()
    if is_sqlite(coordinator.db_url):
        path = make_url(coordinator.db_url).database
        on, off = ["chattr", "+i", str(path)], ["chattr", "-i", str(path)]
        subprocess.run(on, check=True)
    else:
        name = make_url(coordinator.db_url).database
        on = off = []
        _admin_sql(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        coordinator.start(ready=(503,))
        yield
    finally:
        coordinator.stop()
        if off:
            subprocess.run(off, check=True)
        else:
            _admin_sql(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        coordinator.start()


def assert_json_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"] == "application/json", r.headers
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "Traceback" not in r.text
    return detail


def test_unwritable_store_is_degraded_and_writes_get_json_503(coordinator: Coordinator) -> None:
    assert httpx.get(coordinator.url + "/healthz", timeout=30.0).json()["database"] == "ok"
    with unwritable(coordinator):
        health = httpx.get(coordinator.url + "/healthz", timeout=30.0)
        assert health.status_code == 503
        assert health.json()["status"] == "degraded" and health.json()["database"] == "read-only"
        with coordinator.admin() as admin:
            assert admin.get("/workers").status_code == 200  # reads still work
            r = admin.post("/enroll-tokens", json={})
            assert "database is unavailable" in assert_json_error(r, 503)
            assert r.headers["retry-after"] == "5"
        assert httpx.get(coordinator.url + "/", timeout=30.0).status_code == 200  # the fleet page only reads
    assert httpx.get(coordinator.url + "/healthz", timeout=30.0).status_code == 200
    with coordinator.admin() as admin:
        assert admin.post("/enroll-tokens", json={}).status_code == 201


def test_vanished_database_is_json_503_and_html_503(coordinator: Coordinator) -> None:
    """PostgreSQL: the database renamed away under the running coordinator (its connections cut)."""
    if is_sqlite(coordinator.db_url):
        pytest.skip("PostgreSQL only: an open SQLite file cannot vanish from under its connections")
    name = make_url(coordinator.db_url).database
    cut = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
    # no new connection between the cut and the rename (the coordinator's pool reconnects at once: a CI
    # run's rename once found "1 other session using the database")
    _admin_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false', cut,
               f'ALTER DATABASE "{name}" RENAME TO "{name}_gone"')
    try:
        health = httpx.get(coordinator.url + "/healthz", timeout=30.0)
        assert health.status_code == 503 and health.json()["database"] == "unreachable"
        with coordinator.admin() as admin:
            assert_json_error(admin.get("/workers"), 503)
            assert_json_error(admin.post("/enroll-tokens", json={}), 503)
        page = httpx.get(coordinator.url + "/", timeout=30.0)
        assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
        assert "Database unavailable" in page.text
    finally:
        _admin_sql(f'ALTER DATABASE "{name}_gone" RENAME TO "{name}"',
                   f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert httpx.get(coordinator.url + "/healthz", timeout=30.0).status_code == 200
    with coordinator.admin() as admin:
        assert admin.get("/workers").status_code == 200


def test_unexpected_database_error_is_a_json_500(coordinator: Coordinator) -> None:
    """A database error that is no outage (here a trigger that refuses every new enrollment token)
    is an internal error: a JSON 500 with the security headers; the cause is logged, not shown."""
    if is_sqlite(coordinator.db_url):
        with sqlite3.connect(str(make_url(coordinator.db_url).database)) as conn:
            conn.execute("CREATE TRIGGER kf_boom BEFORE INSERT ON enrollment_tokens "
                         "BEGIN SELECT RAISE(ABORT, 'boom from a test trigger'); END")
    else:
        url = make_url(coordinator.db_url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE FUNCTION kf_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "RAISE EXCEPTION 'boom from a test trigger' USING ERRCODE = 'XX000'; END $$")
            conn.execute("CREATE TRIGGER kf_boom BEFORE INSERT ON enrollment_tokens "
                         "FOR EACH ROW EXECUTE FUNCTION kf_boom()")
    with coordinator.admin() as admin:
        r = admin.post("/enroll-tokens", json={})
        assert "internal error" in assert_json_error(r, 500)
        assert "boom" not in r.text
        assert r.headers["x-content-type-options"] == "nosniff"
        assert admin.get("/workers").status_code == 200  # the rest still works
    assert "boom from a test trigger" in coordinator.logs()
