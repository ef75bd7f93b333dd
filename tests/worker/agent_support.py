"""Helpers for the worker-agent integration tests: real ``kernelfleet worker`` processes against a
real coordinator (the ``coordinator`` / ``coordinator_factory`` fixtures)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from conftest import Coordinator, kernelfleet_cmd
from sqlalchemy import create_engine, text

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float = 60.0,
    every: float = 0.1,
    diagnostics: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{diagnostics()}" if diagnostics else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(every)


def mint_enroll_token(coordinator: Coordinator, **body: Any) -> str:
    with coordinator.admin() as admin:
        r = admin.post("/enroll-tokens", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def create_campaign(coordinator: Coordinator, shapes: list[str], dtypes: list[str], **extra: Any) -> int:
    body = {
        "name": "agent-test",
        "kernels": ["rmsnorm"],
        "shapes": shapes,
        "dtypes": dtypes,
        "target_backend": "cpu",
        **extra,
    }
    with coordinator.admin() as admin:
        r = admin.post("/campaigns", json=body)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])


def jobs(coordinator: Coordinator, campaign_id: int | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"limit": 10_000}
    if campaign_id is not None:
        params["campaign_id"] = campaign_id
    with coordinator.admin() as admin:
        r = admin.get("/jobs", params=params)
        assert r.status_code == 200, r.text
        return list(r.json())


def workers(coordinator: Coordinator) -> dict[str, dict[str, Any]]:
    """Enrolled workers by name."""
    with coordinator.admin() as admin:
        r = admin.get("/workers")
        assert r.status_code == 200, r.text
        return {w["name"]: w for w in r.json()}


def results(coordinator: Coordinator) -> list[dict[str, Any]]:
    """Every stored result row (job_id, worker_id, kernel, shape, dtype), straight from the database:
    the API has no result listing, and this is the ground truth for "exactly once"."""
    url = coordinator.db_url
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = (
                conn.execute(
                    text(
                        "SELECT job_id, worker_id, kernel, shape, dtype, lease_token FROM results ORDER BY id"
                    )
                )
                .mappings()
                .all()
            )
            return [dict(r) for r in rows]
    finally:
        engine.dispose()


@dataclass
class WorkerProc:
    """One ``kernelfleet worker`` process; its stderr/stdout go to a log file."""

    name: str
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"worker {self.name} did not exit within {timeout:.0f}s:\n{self.log()}"
            ) from None

    def pending(self) -> list[Path]:
        return sorted((self.state_dir / "spool" / "pending").glob("*.json"))

    def quarantined(self) -> list[Path]:
        return sorted(
            p
            for p in (self.state_dir / "spool" / "quarantine").glob("*")
            if not p.name.endswith(".reason.txt")
        )


def start_worker(
    coordinator_url: str, state_dir: Path, name: str, *args: str, enroll_token: str | None = None
) -> WorkerProc:
    cmd = kernelfleet_cmd(
        "worker", "--coordinator", coordinator_url, "--state-dir", str(state_dir), "--name", name, *args
    )
    if enroll_token is not None:
        cmd += ["--enroll-token", enroll_token]
    log_path = state_dir.parent / f"{state_dir.name}-{time.monotonic_ns()}.log"
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    env.pop("KERNELFLEET_ENROLL_TOKEN", None)
    env.pop("KERNELFLEET_COORDINATOR", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return WorkerProc(name=name, state_dir=state_dir, log_path=log_path, proc=proc, args=list(args))


def stop_all(procs: list[WorkerProc]) -> dict[str, int]:
    """SIGTERM every live worker and collect exit codes (by name)."""
    for p in procs:
        p.terminate()
    return {p.name: p.wait() for p in procs}


def run_worker(
    coordinator_url: str,
    state_dir: Path,
    name: str,
    *args: str,
    enroll_token: str | None = None,
    timeout: float = 60.0,
) -> tuple[int, str]:
    """Run a worker that is expected to exit on its own; returns (exit code, output)."""
    w = start_worker(coordinator_url, state_dir, name, *args, enroll_token=enroll_token)
    code = w.wait(timeout)
    return code, w.log()
