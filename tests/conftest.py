"""Shared fixtures: fresh databases (SQLite file, and PostgreSQL when configured) and a real
coordinator: the app under uvicorn on the real HTTP stack, on a thread of the test process (started
in a fraction of a second), or as a ``kernelfleet serve`` subprocess for the tests whose subject is
processes (marked ``coordinator_process``: signals, restarts, replicas, outages, serve's own output).

Every test that takes ``db_url`` (or ``coordinator``) runs once on SQLite and, when
``KERNELFLEET_TEST_POSTGRES_URL`` is set, once more on its own fresh PostgreSQL database.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from inproc import ThreadServer, free_port, settings_from_env
from sqlalchemy.engine import make_url

POSTGRES_URL = os.environ.get("KERNELFLEET_TEST_POSTGRES_URL")
BACKENDS = ["sqlite"] + (["postgres"] if POSTGRES_URL else [])


def kernelfleet_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, from this interpreter's environment."""
    return [sys.executable, "-m", "kernelfleet.worker.cli", *args]


def _pg_admin(*statements: str) -> None:
    """Run statements (CREATE/DROP DATABASE) on the configured PostgreSQL, outside a transaction."""
    import psycopg

    admin = make_url(POSTGRES_URL or "").set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _create_pg_database(template: str | None = None) -> tuple[str, str]:
    name = "kf_" + secrets.token_hex(6)
    _pg_admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    url = make_url(POSTGRES_URL or "").set(database=name, drivername="postgresql+psycopg")
    return name, url.render_as_string(hide_password=False)


def _drop_pg_database(name: str) -> None:
    _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# a test's databases are dropped on a thread of their own (a DROP DATABASE waits for a checkpoint:
# about 0.6 s that no test needs to wait for); the session waits for the last ones
_dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drop-database")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database URL: empty (un-migrated), or, for a test that asks for ``migrated_db_url``, a
    copy of its backend's migrated template, made at once (on PostgreSQL a ``CREATE DATABASE ...
    TEMPLATE``, not an empty database first)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kernelfleet.db'}"
        return
    request.applymarker(pytest.mark.postgres)
    template = None
    if "migrated_db_url" in request.fixturenames:
        templates: MigratedTemplates = request.getfixturevalue("migrated_templates")
        template = templates.template("postgres")
    name, url = _create_pg_database(template)
    try:
        yield url
    finally:
        _dropper.submit(_drop_pg_database, name)


class MigratedTemplates:
    """One database per backend and test process, migrated by ``kernelfleet db upgrade`` the first
    time a test asks for it and copied for every test after (a file copy on SQLite, ``CREATE
    DATABASE ... TEMPLATE`` on PostgreSQL): the upgrade subprocess costs about 1.5 s of CPU, a copy
    milliseconds, and some 200 tests start on a migrated database."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.made: dict[str, str] = {}  # backend -> SQLite file path or PostgreSQL database name

    def template(self, backend: str) -> str:
        if backend not in self.made:
            if backend == "sqlite":
                path = self.directory / "template.db"
                url, made = f"sqlite:///{path}", str(path)
            else:
                made, url = _create_pg_database()
            subprocess.run(kernelfleet_cmd("db", "upgrade", "--database-url", url), check=True,
                           capture_output=True, text=True)
            self.made[backend] = made
        return self.made[backend]

    def fill(self, db_url: str) -> None:
        """Make the fresh, empty database at ``db_url`` a copy of its backend's migrated template."""
        url = make_url(db_url)
        if url.get_backend_name() == "sqlite":
            shutil.copyfile(self.template("sqlite"), str(url.database))
        # PostgreSQL: db_url made it from the template already

    def drop(self) -> None:
        if "postgres" in self.made:
            _drop_pg_database(self.made["postgres"])


@pytest.fixture(scope="session")
def migrated_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigratedTemplates]:
    templates = MigratedTemplates(tmp_path_factory.mktemp("templates"))
    yield templates
    _dropper.shutdown(wait=True)  # the tests' databases first: each was made from the template
    templates.drop()


@pytest.fixture
def migrated_db_url(db_url: str, migrated_templates: MigratedTemplates) -> str:
    """A fresh database at the newest schema revision, as ``kernelfleet db upgrade`` leaves it."""
    migrated_templates.fill(db_url)
    return db_url


@dataclass
class Coordinator:
    """A real coordinator: a ``kernelfleet serve`` process, or (``process=False``) the same app under
    uvicorn on a thread of this process, its background loop in the server. ``stop()``/``start()``
    restart it on the same port and DB."""

    db_url: str
    workdir: Path
    admin_token: str = field(default_factory=lambda: "adm-" + secrets.token_urlsafe(24))
    port: int = field(default_factory=free_port)
    env_overrides: dict[str, str] = field(default_factory=dict)
    serve_args: tuple[str, ...] = ()  # more `kernelfleet serve` options, e.g. ("--workers", "2")
    process: bool = True
    proc: subprocess.Popen[bytes] | None = None
    thread: ThreadServer | None = None
    _logs: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"coordinator-{self._logs}.log"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "KERNELFLEET_DATABASE_URL": self.db_url,
            "KERNELFLEET_ADMIN_TOKEN": self.admin_token,
            "PYTHONUNBUFFERED": "1",
            # background work (reactions, profiles): passes every 0.2 s; calibration whenever stats change
            "KERNELFLEET_BACKGROUND_INTERVAL_SECONDS": "0.2",
            "KERNELFLEET_CALIBRATION_INTERVAL_SECONDS": "0",
            # a chip's profile is rebuilt on the next pass, not after the production 5 s interval
            # (test_profile_builder.py covers the interval)
            "KERNELFLEET_PROFILE_MIN_INTERVAL_SECONDS": "0",
        })
        env.update(self.env_overrides)
        return env

    def start(self, timeout: float = 90.0, ready: tuple[int, ...] = (200,)) -> None:
        """Start and wait until ``/healthz`` answers one of ``ready`` (503: a degraded database). The
        bounds are stall detectors, not latency targets: on a saturated 2-core host a coordinator has
        taken over 30 s to come up, and a health probe over 1 s to answer."""
        assert self.proc is None and self.thread is None, "already running"
        self._logs += 1
        if not self.process:
            self.thread = ThreadServer(settings_from_env(self.env(), host="127.0.0.1", port=self.port),
                                       self.log_path)
            try:
                self.thread.start(timeout)
            except BaseException:
                self.thread = None
                raise
            return
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            kernelfleet_cmd("serve", "--host", "127.0.0.1", "--port", str(self.port), *self.serve_args),
            env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"coordinator exited early:\n{self.logs()}")
                try:
                    if httpx.get(self.url + "/healthz", timeout=5.0).status_code in ready:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            raise RuntimeError(f"coordinator did not become healthy:\n{self.logs()}")
        except BaseException:
            self.stop(signal.SIGKILL)  # a server that never became healthy does not outlive the test
            raise

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.thread is not None:
            assert sig == signal.SIGTERM, "only a coordinator process takes other signals (process=True)"
            self.thread.stop()
            self.thread = None
            return
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def logs(self) -> str:
        logs = sorted(self.workdir.glob("coordinator-*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url + "/api/v1", timeout=30.0,
                            headers={"Authorization": f"Bearer {self.admin_token}"})

    def settle(self, timeout: float = 30.0, *, profiles: bool = False) -> None:
        """Until the background loop has run the reactions (result hooks) of every stored result; with
        ``profiles``, also until it has made every due calibration and answered every queued profile
        request. (A calibration queues its backend's chips: their profiles get a new version from
        the same results, so a test that counts versions settles first.)"""
        from sqlalchemy import func, select

        from kernelfleet.service.db import make_engine
        from kernelfleet.service.models import Calibration, ConfigStat, ProfileRequest, ResultEvent

        def busy(conn: Any) -> str | None:
            if conn.scalar(select(func.count()).select_from(ResultEvent)):
                return "result reactions still queued"
            if not profiles:
                return None
            if conn.scalar(select(func.count()).select_from(ProfileRequest)):
                return "profile requests still queued"
            seen = dict(conn.execute(select(ConfigStat.backend, func.max(ConfigStat.last_result_id))
                                     .where(ConfigStat.backend != "cpu").group_by(ConfigStat.backend)).all())
            for backend, newest in seen.items():
                last = conn.scalar(select(Calibration.source_stats).where(Calibration.backend == backend)
                                   .order_by(Calibration.id.desc()).limit(1))
                if last != newest:
                    return f"{backend} calibration not current"
            return None

        engine = make_engine(self.db_url)
        deadline = time.monotonic() + timeout
        try:
            while True:
                with engine.connect() as conn:
                    why = busy(conn)
                if why is None:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"{why} after {timeout} s")
                time.sleep(0.05)
        finally:
            engine.dispose()

    def profile(self, chip: str, *, min_version: int = 1, timeout: float = 30.0,
                **params: str) -> dict[str, object]:
        """The chip's profile once the background builder has made version ``min_version`` or newer."""
        from urllib.parse import quote

        deadline = time.monotonic() + timeout
        with self.admin() as c:
            while True:
                r = c.get(f"/profiles/{quote(chip, safe='')}", params=params)
                if r.status_code == 200 and int(r.json()["version"]) >= min_version:
                    return dict(r.json())
                assert r.status_code in (200, 202), r.text
                if time.monotonic() > deadline:
                    raise AssertionError(f"no profile version {min_version} for {chip!r} after {timeout} s: "
                                         f"{r.status_code} {r.text[:300]}")
                time.sleep(0.1)

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url + "/api/v1", timeout=30.0, headers=headers)


@pytest.fixture
def coordinator_factory(migrated_db_url: str, tmp_path: Path,
                        request: pytest.FixtureRequest) -> Iterator[object]:
    """Build coordinators with custom settings: ``coordinator_factory(KERNELFLEET_LEASE_SECONDS="2")``.
    In-thread, unless the test is marked ``coordinator_process``."""
    made: list[Coordinator] = []
    process = request.node.get_closest_marker("coordinator_process") is not None

    def make(**env: str) -> Coordinator:
        c = Coordinator(db_url=migrated_db_url, workdir=tmp_path, env_overrides=env, process=process)
        c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture
def coordinator(coordinator_factory) -> Coordinator:  # type: ignore[no-untyped-def]
    """A running coordinator on a fresh, migrated database (SQLite, and PostgreSQL when configured)."""
    return coordinator_factory()  # type: ignore[no-any-return, operator]


LONG_MARKERS = ("slow", "browser", "coordinator_process")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with long tests (marked slow, browser or coordinator_process) first: pytest-xdist's
    ``--dist loadfile`` hands out files in this order, so the long ones start early and the short
    ones fill in around them, rather than one long file running alone at the end."""
    long_files = {item.path for item in items if any(item.get_closest_marker(m) for m in LONG_MARKERS)}
    items.sort(key=lambda item: item.path not in long_files)  # stable: the order within each file stays
