"""The coordinator's command line: serve (un-migrated database, local admin token, local worker),
the admin commands and `kernelfleet import`, each run as a user would."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import Coordinator, free_port, kernelfleet_cmd
from coordinator_helpers import make_report
from inproc import run_cli as run_in_process


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            process: bool = True) -> subprocess.CompletedProcess[str]:
    """``kernelfleet ARGS`` as a subprocess of the installed CLI, without the admin token from the
    environment; or (``process=False``) in this process, under click's runner."""
    if not process:
        r = run_in_process(*args, env={"KERNELFLEET_ADMIN_TOKEN": None, **(env or {}), "COLUMNS": "200"})
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    full = dict(os.environ)
    full.pop("KERNELFLEET_ADMIN_TOKEN", None)
    full.update(env or {})
    full["COLUMNS"] = "200"
    return subprocess.run(kernelfleet_cmd(*args), capture_output=True, text=True, env=full, timeout=timeout)


def test_serve_refuses_an_unmigrated_database(db_url: str) -> None:
    r = run_cli("serve", "--database-url", db_url, "--port", str(free_port()),
                env={"KERNELFLEET_ADMIN_TOKEN": "x"})
    assert r.returncode != 0
    assert "kernelfleet db upgrade" in r.stderr and "no KernelFleet schema" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_serve_reports_an_unreachable_database() -> None:
    r = run_cli("serve", "--database-url", "postgresql://nobody@127.0.0.1:1/none", "--port", str(free_port()))
    assert r.returncode != 0 and "cannot open the database" in r.stderr
    assert "Traceback" not in r.stderr


def _wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    """A stall detector, as the fixtures' ``Coordinator.start``: a loaded 2-core host has taken over 30 s
    to bring a coordinator up, and a health answer over 1 s while it starts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("not healthy")


def _serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = dict(os.environ)
    env.pop("KERNELFLEET_ADMIN_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(kernelfleet_cmd("serve", "--database-url", f"sqlite:///{tmp_path / 'k.db'}",
                                            "--port", str(port), *extra),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc)
    return proc, url


def _stop(proc: subprocess.Popen[str]) -> str:
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return out


def test_local_mode_generates_an_admin_token_once_and_keeps_it(tmp_path: Path) -> None:
    assert run_cli("db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 'k.db'}").returncode == 0
    proc, url = _serve(tmp_path)
    first = _stop(proc)
    path = tmp_path / "admin_token"
    token = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token in first and "Generated an admin token" in first

    proc, url = _serve(tmp_path)
    try:
        r = httpx.get(url + "/api/v1/workers", headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
        assert r.status_code == 200 and r.json() == []
        # the admin CLI finds the local token by itself
        listed = run_cli("admin", "workers", "list", "--coordinator", url,
                         env={"KERNELFLEET_DATABASE_URL": f"sqlite:///{tmp_path / 'k.db'}"})
        assert listed.returncode == 0, listed.stderr
    finally:
        second = _stop(proc)
    assert token not in second, "the token is printed only when it is generated"


def test_admin_cli_end_to_end(coordinator: Coordinator) -> None:
    """In-process (click's runner): the admin commands' real processes run in
    test_admin_cli_errors_are_clear, test_campaign_control and test_cli_wording."""
    env = {"KERNELFLEET_ADMIN_TOKEN": coordinator.admin_token}
    base = ("--coordinator", coordinator.url)
    r = run_cli("admin", "campaign", "create", "--name", "norms", "--kernel", "rmsnorm",
                "--kernel", "softmax", "--shape", "4096x4096", "--dtype", "float16", "--backend", "cuda",
                "--chip", "NVIDIA H100*",
                "--max-attempts", "4", *base, env=env, process=False)
    assert r.returncode == 0, r.stderr
    assert "2 jobs queued for cuda NVIDIA H100*" in r.stdout
    r = run_cli("admin", "campaign", "list", *base, env=env, process=False)
    assert r.returncode == 0 and "norms" in r.stdout and "rmsnorm,softmax" in r.stdout
    r = run_cli("admin", "jobs", "list", "--campaign", "1", "--state", "queued", *base, env=env,
                process=False)
    assert r.returncode == 0 and "2 jobs" in r.stdout and "0/4" in r.stdout

    r = run_cli("admin", "enroll-token", "--ttl", "60", *base, "--admin-token", coordinator.admin_token,
                process=False)
    assert r.returncode == 0, r.stderr
    enroll_token = next(line for line in r.stdout.splitlines() if line.startswith("kfe_"))
    with coordinator.client() as c:
        w = c.post("/workers/enroll", json={"enrollment_token": enroll_token, "name": "mac-mini",
                                            "chip": "Apple M4", "backend": "metal"})
        assert w.status_code == 201
    r = run_cli("admin", "workers", "list", *base, env=env, process=False)
    assert r.returncode == 0 and "mac-mini" in r.stdout and "online" in r.stdout
    r = run_cli("admin", "workers", "revoke", str(w.json()["worker_id"]), *base, env=env, process=False)
    assert r.returncode == 0 and "revoked" in r.stdout
    r = run_cli("admin", "workers", "list", *base, env=env, process=False)
    assert "revoked" in r.stdout


def test_admin_cli_errors_are_clear(coordinator: Coordinator) -> None:
    cases = [
        (("admin", "campaign", "list"), "wrong", "401: invalid admin token"),
        (("admin", "campaign", "create", "--name", "x", "--kernel", "rmsnorm", "--shape", "8x8", "--dtype",
          "float64"), coordinator.admin_token, "--dtype 'float64': unknown dtype"),  # not "dtypes.0"
        (("admin", "workers", "revoke", "999"), coordinator.admin_token, "worker 999 does not exist"),
    ]
    for args, token, message in cases:
        r = run_cli(*args, "--coordinator", coordinator.url, env={"KERNELFLEET_ADMIN_TOKEN": token})
        assert r.returncode == 1 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_admin_cli_without_a_coordinator_or_token(tmp_path: Path) -> None:
    r = run_cli("admin", "jobs", "list", "--coordinator", f"http://127.0.0.1:{free_port()}",
                env={"KERNELFLEET_ADMIN_TOKEN": "x"})
    assert r.returncode == 1 and "cannot reach the coordinator" in r.stderr
    r = run_cli("admin", "jobs", "list", env={"KERNELFLEET_DATA_DIR": str(tmp_path)})
    assert r.returncode == 1 and "no admin token" in r.stderr


def test_import_cli(coordinator: Coordinator, tmp_path: Path) -> None:
    env = {"KERNELFLEET_ADMIN_TOKEN": coordinator.admin_token}
    bad = tmp_path / "bad.jsonl"
    broken = make_report()
    broken["trials"][1]["median_us"] = None
    bad.write_text("\n".join([json.dumps(make_report()), "{not json", json.dumps(broken)]) + "\n")
    r = run_cli("import", str(bad), "--coordinator", coordinator.url, env=env)
    assert r.returncode == 1
    assert "bad.jsonl line 2: not valid JSON" in r.stderr
    assert "bad.jsonl line 3: not a valid tuning report" in r.stderr and "nothing was imported" in r.stderr
    assert "Traceback" not in r.stderr

    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps(make_report(shape=f"{i}x8")) for i in range(1, 6)) + "\n\n")
    r = run_cli("import", str(good), "--coordinator", coordinator.url,
                "--admin-token", coordinator.admin_token)
    assert r.returncode == 0, r.stderr
    assert "imported 5 reports" in r.stdout
    r = run_cli("import", str(tmp_path / "missing.jsonl"), "--coordinator", coordinator.url, env=env)
    assert r.returncode == 1 and "cannot read" in r.stderr


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def _status(pid: int | str) -> dict[str, str]:
    """/proc/PID/status as fields ({} once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, v in (line.split(":\t", 1) for line in lines if ":\t" in line)}


def _alive_named(pid: int | str, name: str) -> bool:
    fields = _status(pid)
    return fields.get("Name") == name and not fields.get("State", "").startswith("Z")


def _children_named(parent: int, name: str) -> list[int]:
    """Live child processes of ``parent`` whose name (/proc/PID/comm) is ``name``."""
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if _alive_named(p.name, name) and _status(p.name).get("PPid") == str(parent)]


def _stop_server_only(proc: subprocess.Popen[str]) -> str:
    """SIGTERM to the coordinator alone (as `kill PID` would), not to its process group."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return out


def test_local_worker_is_started_and_stopped_with_the_server(tmp_path: Path) -> None:
    assert run_cli("db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 'k.db'}").returncode == 0
    proc, url = _serve(tmp_path, "--local-worker")
    token = (tmp_path / "admin_token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    try:
        deadline = time.monotonic() + 60
        workers: list[dict[str, object]] = []
        while time.monotonic() < deadline and not workers:
            workers = httpx.get(url + "/api/v1/workers", headers=auth, timeout=30.0).json()
            time.sleep(0.2)
        assert len(workers) == 1, "the local worker enrolled itself"
        # serve runs the background loop in one process of its own, named so `ps` and bench-load tell it
        background = _children_named(proc.pid, "kf-background")
        assert len(background) == 1
        pids = _processes_mentioning(str(tmp_path / "local-worker"))
        assert pids
        for pid in pids:  # the enrollment token travels in the environment, not on the command line (ps)
            assert b"--enroll-token" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    finally:
        out = _stop_server_only(proc)
    assert (tmp_path / "local-worker" / "token").exists(), out
    assert f"KernelFleet dashboard at {url}/" in out
    # uvicorn re-raises the SIGTERM once shut down, so the background process may outlive serve by a
    # moment: it sees its parent gone at its next pass and stops by itself
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_processes_mentioning(str(tmp_path / "local-worker"))
                                           or _alive_named(background[0], "kf-background")):
        time.sleep(0.2)
    assert not _processes_mentioning(str(tmp_path / "local-worker")), "SIGTERM to serve stops its worker"
    assert not _alive_named(background[0], "kf-background"), "... and its background process"
    # a second start reuses the worker's stored token instead of enrolling again
    proc, url = _serve(tmp_path, "--local-worker")
    try:
        time.sleep(3)
        workers = httpx.get(url + "/api/v1/workers", headers=auth, timeout=30.0).json()
        assert len(workers) == 1
    finally:
        _stop(proc)


def _lock_held(db_url: str) -> bool:
    """Whether a profile builder's lock is held on this database: a KernelFleet advisory lock
    (pg_locks) on PostgreSQL, the builder's file lock beside the database on SQLite."""
    import fcntl

    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from kernelfleet.service.db import make_engine
    from kernelfleet.service.locks import LOCK_CLASS

    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        db = Path(str(url.database))
        with open(db.with_name(f"{db.name}.builder.lock"), "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return bool(conn.scalar(text(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.classid = :c AND d.datname = current_database()"),
                {"c": LOCK_CLASS}))
    finally:
        engine.dispose()


@pytest.mark.coordinator_process  # serve's own processes are the subject
def test_serve_and_its_background_process_end_together(coordinator_factory, migrated_db_url: str  # type: ignore[no-untyped-def]
                                                       ) -> None:
    """A signal to serve alone (not its group, as a supervisor's `kill PID` sends) in the middle of a
    profile build: within 5 s no kf-background is left, and no builder lock is held. (A build's pass
    runs on a worker thread that asyncio.run used to wait for: minutes, with its locks.) One signal
    per backend, to keep it quick: SIGTERM on SQLite, kill -9 on PostgreSQL."""
    from sqlalchemy import text

    from kernelfleet.service.db import make_engine

    sig = signal.SIGTERM if migrated_db_url.startswith("sqlite") else signal.SIGKILL
    coordinator = coordinator_factory(KERNELFLEET_PROFILE_BUILD_DELAY_SECONDS="120")
    assert coordinator.proc is not None
    background = _children_named(coordinator.proc.pid, "kf-background")
    assert len(background) == 1
    engine = make_engine(coordinator.db_url)
    with engine.begin() as conn:  # a queued build: the builder takes the chip's lock, then sleeps in it
        conn.execute(text("INSERT INTO profile_requests (chip, allow_predicted) VALUES ('Apple M4', true)"))
    engine.dispose()
    deadline = time.monotonic() + 20
    while not _lock_held(coordinator.db_url):
        assert time.monotonic() < deadline, "the background process never started the build"
        time.sleep(0.05)

    os.kill(coordinator.proc.pid, sig)
    killed = time.monotonic()
    coordinator.proc.wait(timeout=15)
    coordinator.proc = None
    while time.monotonic() - killed < 5 and (_alive_named(background[0], "kf-background")
                                             or _lock_held(coordinator.db_url)):
        time.sleep(0.05)
    gone = time.monotonic() - killed
    assert not _alive_named(background[0], "kf-background"), "kf-background outlived serve by 5 s"
    assert not _lock_held(coordinator.db_url), "a lock outlived serve by 5 s"
    print(f"{signal.Signals(sig).name}: kf-background and its lock gone {gone:.2f} s after the signal")


@pytest.mark.coordinator_process  # serve's own signal handling is the subject
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # nothing here depends on the database
def test_a_long_polled_lease_gets_204_when_serve_shuts_down(coordinator_factory) -> None:  # type: ignore[no-untyped-def]
    """A worker waiting on a long-polled lease gets 204 (nothing to do) as soon as serve is told to
    stop, and serve exits: its graceful shutdown does not wait out the poll (`make run`'s Ctrl-C took
    10 s with its idle local worker). Before, the request held the shutdown until uvicorn's 10 s
    graceful timeout cancelled it: the worker got a 500."""
    from concurrent.futures import ThreadPoolExecutor

    from coordinator_helpers import enroll

    coordinator = coordinator_factory(KERNELFLEET_LEASE_WAIT_MAX_SECONDS="300")
    assert coordinator.proc is not None
    _, token = enroll(coordinator)

    def poll() -> httpx.Response:
        with coordinator.client(token) as w:
            return w.post("/leases", json={"wait_seconds": 300}, timeout=600)

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(poll)
        time.sleep(1.0)  # the request on its way (if not yet waiting, it finds serve stopping: 204 too)
        assert not answer.done(), answer.result().text
        os.kill(coordinator.proc.pid, signal.SIGTERM)
        assert answer.result(timeout=120).status_code == 204
    coordinator.proc.wait(timeout=60)
    coordinator.proc = None
    assert "Traceback" not in coordinator.logs(), coordinator.logs()[-3000:]
