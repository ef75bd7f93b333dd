"""What a new user reads from the command line: plain help (TEXT, not <str>), --version, one wording
of "unreachable" and of a URL without http:// for admin, worker and pull, /api/v1 URLs accepted,
counted nouns, the catalog's bracketed text, pull's --token, a busy port, quiet idle polls.
Commands run in this process (click's runner: the same output and exit code, without a Python start
each); the entry point itself (``--version``, top-level help, URLs without http://, whose message
may come from its error handler), an unreachable admin command, an import and serve on a busy port
run as a user runs them (a subprocess of the installed CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import Coordinator, free_port, kernelfleet_cmd
from coordinator_helpers import enroll, make_report
from inproc import run_cli as run_in_process

UNSET = ("KERNELFLEET_ADMIN_TOKEN", "KERNELFLEET_COORDINATOR")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            process: bool = False) -> subprocess.CompletedProcess[str]:
    """``kernelfleet ARGS`` with COLUMNS=200 and neither admin token nor coordinator from the
    environment: in this process, or (``process``) as a subprocess of the installed CLI."""
    if not process:
        r = run_in_process(*args, env={**dict.fromkeys(UNSET), **(env or {}), "COLUMNS": "200"})
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    full = {k: v for k, v in os.environ.items() if k not in UNSET}
    full.update(env or {})
    full["COLUMNS"] = "200"
    return subprocess.run(kernelfleet_cmd(*args), capture_output=True, text=True, env=full, timeout=timeout)


HELP = [(), ("tune",), ("worker",), ("pull",), ("serve",), ("import",), ("admin", "campaign", "create"),
        ("admin", "workers", "revoke")]


def test_help_uses_plain_metavars_and_there_is_a_version() -> None:
    helps = {}
    for args in HELP:
        r = run_cli(*args, "--help", process=args == ())
        assert r.returncode == 0, (args, r.stderr)
        for typer_label in ("<str>", "<bool>", "<int>", "<float>", "<list[", "{kernel}", "{path}"):
            assert typer_label not in r.stdout, (args, typer_label, r.stdout)
        helps[args] = r.stdout
    tune_help = helps[("tune",)]
    assert "Usage: kernelfleet tune [OPTIONS] KERNEL" in tune_help
    assert "--shape" in tune_help and "TEXT" in tune_help
    r = run_cli("--version", process=True)
    assert r.returncode == 0 and r.stdout.startswith("kernelfleet ") and ", mlx " in r.stdout, r.stdout
    pull_help = helps[("pull",)]
    # pull takes a read token (or an admin one): --token; the name --admin-token still works, hidden
    assert "--token " in pull_help and "--admin-token" not in pull_help


def test_kernels_keeps_bracketed_text() -> None:
    r = run_cli("kernels")
    assert r.returncode == 0
    assert "returns [normed, new residual]" in r.stdout  # not eaten as rich markup


def test_a_url_without_http_says_add_http_everywhere(tmp_path: Path) -> None:
    for args in (("admin", "workers", "list", "--admin-token", "x"),
                 ("pull", "--chip", "Apple M2", "--no-zmlx"),
                 ("worker", "--state-dir", str(tmp_path / "w"), "--enroll-token", "x")):
        # subprocesses: worker's message comes from the entry point's error handler (main)
        r = run_cli(*args, "--coordinator", "127.0.0.1:8600", env={"HOME": str(tmp_path)}, process=True)
        assert r.returncode != 0, args
        said = " ".join(r.stderr.split())
        assert "has no scheme: add http:// (e.g. --coordinator http://127.0.0.1:8600)" in said, (args, said)
        assert "UnsupportedProtocol" not in r.stderr and "Traceback" not in r.stderr


def test_unreachable_reads_the_same_for_admin_worker_and_pull(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    expected = (f"cannot reach the coordinator at {url} (connection refused): is `kernelfleet serve` "
                "running there? Check --coordinator or KERNELFLEET_COORDINATOR.")
    for args in (("admin", "workers", "list", "--admin-token", "x"),
                 ("pull", "--chip", "Apple M2", "--no-zmlx"),
                 ("worker", "--state-dir", str(tmp_path / "w"), "--enroll-token", "x")):
        r = run_cli(*args, "--coordinator", url + "/", env={"HOME": str(tmp_path)},
                    process=args[0] == "admin")
        assert r.returncode != 0, args
        assert expected in " ".join(r.stderr.split()), (args, r.stderr)


def test_api_v1_urls_counted_nouns_status_and_pull_token(coordinator: Coordinator, tmp_path: Path) -> None:
    env = {"KERNELFLEET_ADMIN_TOKEN": coordinator.admin_token}
    api = coordinator.url + "/api/v1"
    assert " 0 workers " in run_cli("admin", "workers", "list", "--coordinator", api, env=env).stdout
    _, token = enroll(coordinator, "m2", "Apple M2", "metal")
    with coordinator.client(token) as w:  # one lease poll: the worker is online
        assert w.post("/leases", json={}).status_code == 204
    r = run_cli("admin", "workers", "list", "--coordinator", api + "/", env=env)
    assert r.returncode == 0, r.stderr
    assert " 1 worker " in r.stdout and " online " in r.stdout and "active" not in r.stdout, r.stdout
    r = run_cli("admin", "campaign", "create", "--name", "one", "--kernel", "rmsnorm", "--shape", "32x4096",
                "--dtype", "float16", "--chip", "Apple M2", "--coordinator", coordinator.url, env=env)
    assert r.returncode == 0 and "1 job queued for Apple M2" in r.stdout, r.stdout + r.stderr
    assert " 1 campaign " in run_cli("admin", "campaign", "list", "--coordinator", api, env=env).stdout
    reports = tmp_path / "one.jsonl"
    reports.write_text(json.dumps(make_report()) + "\n")
    r = run_cli("import", str(reports), "--coordinator", api, env=env, process=True)
    assert r.returncode == 0 and "imported 1 report from" in r.stdout, r.stdout + r.stderr
    r = run_cli("import", str(reports), "--coordinator", api, env=env)
    assert "imported 0 reports" in r.stdout and "(1 report already imported before" in r.stdout
    for name in ("--token", "--admin-token"):  # the old name still works
        r = run_cli("pull", "--coordinator", api, "--chip", "NVIDIA Z9", "--no-zmlx", name,
                    coordinator.admin_token, env={"HOME": str(tmp_path)})
        assert r.returncode == 1 and "No such option" not in r.stderr, (name, r.stderr)
        assert "NVIDIA Z9" in r.stderr, r.stderr


@pytest.mark.coordinator_process  # serve's start-up line in its log
def test_a_second_server_on_a_busy_port_says_so_in_one_line(coordinator: Coordinator) -> None:
    r = run_cli("serve", "--port", str(coordinator.port), "--database-url", coordinator.db_url,
                env={"KERNELFLEET_ADMIN_TOKEN": "x"}, timeout=60, process=True)
    assert r.returncode == 1
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{coordinator.port} is already in use" in lines[0], lines
    assert "Errno" not in lines[0] and "Traceback" not in lines[0]
    assert "KernelFleet dashboard at" in coordinator.logs()


@pytest.mark.coordinator_process  # serve's access log
@pytest.mark.slow
def test_idle_lease_polls_stay_out_of_the_access_log(coordinator: Coordinator) -> None:
    _, token = enroll(coordinator, "idle", "Apple M2", "metal")
    with coordinator.client(token) as w:
        for _ in range(5):
            assert w.post("/leases", json={}).status_code == 204
    httpx.get(coordinator.url + "/healthz", timeout=30.0)
    time.sleep(0.5)
    logs = coordinator.logs()
    assert '"GET /healthz HTTP/1.1" 200' in logs  # the access log is on
    assert "POST /api/v1/leases" not in logs
    assert '"POST /api/v1/workers/enroll HTTP/1.1" 201' in logs
