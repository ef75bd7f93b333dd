"""Add a worker: the dashboard page and `kernelfleet admin add-worker` print, for macOS (Metal) and Linux
(CUDA), the commands that install KernelFleet from the coordinator's own wheel and enroll, with the
public URL and a fresh enrollment token; the wheel is served; a token for N GPUs enrolls N workers;
`kernelfleet worker --gpus all` runs one agent per GPU. In-thread coordinators, except where the
processes are the subject (--gpus)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from inproc import fast_settings, run_cli, serve_in_thread

from kernelfleet.service.wheel import wheel_filename

ADMIN = "kfa_test-admin"
PUBLIC = "https://kf.example.com"
ENROLL = {
    "name": "mac",
    "chip": "Apple M3 Max",
    "backend": "metal",
    "os": "macOS 15.1",
    "mlx_version": "0.32.4",
}


@pytest.fixture
def served(migrated_db_url: str) -> Iterator[str]:
    with serve_in_thread(fast_settings(migrated_db_url, public_url=PUBLIC)) as (url, _):
        yield url


def enroll(url: str, token: str, name: str) -> httpx.Response:
    return httpx.post(
        url + "/api/v1/workers/enroll", json={**ENROLL, "enrollment_token": token, "name": name}, timeout=30
    )


def admin_client(base: str) -> httpx.Client:
    """The admin's client, 30 s a request as the suite's others: httpx's default 5 s read timeout
    failed a fresh-clone run on a loaded host (POST /enroll-tokens)."""
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30.0)


def test_cli_prints_install_and_enroll_commands_with_a_fresh_token(served: str) -> None:
    r = run_cli("admin", "add-worker", "--coordinator", served, "--admin-token", ADMIN)
    assert r.exit_code == 0, r.output
    wheel = f"{PUBLIC}/downloads/{wheel_filename()}"
    (token,) = set(re.findall(r"--enroll-token (kfe_\S+)", r.output))
    assert "macOS (Apple silicon, Metal)" in r.output and "Linux (NVIDIA GPU, CUDA)" in r.output
    assert f"uv tool install --python 3.12 {wheel}\n" in r.output
    assert f"uv tool install --python 3.12 'kernelfleet[cuda] @ {wheel}'" in r.output
    assert f"pipx install {wheel}" in r.output
    assert f"kernelfleet worker --coordinator {PUBLIC} --enroll-token {token}" in r.output
    assert "other machines cannot reach it" not in r.output  # a public https URL: nothing to warn about
    assert enroll(served, token, "mac-1").status_code == 201  # the fresh token enrolls one worker
    again = enroll(served, token, "mac-2")
    assert again.status_code == 401 and "already used" in again.json()["detail"]


def test_enroll_token_may_ask_read_token_may_not(served: str) -> None:
    with admin_client(served + "/api/v1") as admin:
        tokens = {
            s: admin.post("/tokens", json={"name": s, "scope": s}).json()["token"] for s in ("enroll", "read")
        }
    r = run_cli(
        "admin", "add-worker", "--gpus", "3", "--coordinator", served, "--admin-token", tokens["enroll"]
    )
    assert r.exit_code == 0, r.output
    assert "enrollment token for 3 workers" in r.output and "--gpus all" in r.output
    (token,) = set(re.findall(r"--enroll-token (kfe_\S+)", r.output))
    assert [enroll(served, token, f"gpu{i}").status_code for i in range(4)] == [201, 201, 201, 401]
    refused = run_cli("admin", "add-worker", "--coordinator", served, "--admin-token", tokens["read"])
    assert (
        refused.exit_code == 1
        and "403" in refused.output
        and "a read token is not accepted" in refused.output
    )
    bad = httpx.post(
        served + "/api/v1/workers/add", json={"gpus": 0}, headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30.0,
    )
    assert bad.status_code == 422 and isinstance(bad.json()["detail"], str)


def test_page_mints_a_token_for_an_enroller_and_shows_token_otherwise(served: str) -> None:
    anonymous = httpx.get(served + "/workers/add", timeout=30.0)
    assert anonymous.status_code == 200 and anonymous.headers["cache-control"] == "no-store"
    assert "--enroll-token TOKEN" in anonymous.text and "Sign in" in anonymous.text
    assert f"{PUBLIC}/downloads/{wheel_filename()}" in anonymous.text
    # (the login cookie is Secure with an https public URL: a bearer header here; test_tokens signs in)
    signed_in = admin_client(served)
    page = signed_in.get("/workers/add", params={"gpus": 2})
    assert page.status_code == 200
    (token,) = set(re.findall(r"--enroll-token (kfe_[\w-]+)", page.text))
    assert "(one per GPU)" in page.text and "--gpus all" in page.text
    assert [enroll(served, token, f"g{i}").status_code for i in range(3)] == [201, 201, 401]
    bad = signed_in.get("/workers/add", params={"gpus": "lots"})
    assert bad.status_code == 422 and "gpus=lots: must be a whole number" in bad.text
    fleet = signed_in.get("/")
    assert 'href="/workers/add"' in fleet.text


def test_a_loopback_public_url_is_called_out(migrated_db_url: str) -> None:
    with serve_in_thread(fast_settings(migrated_db_url)) as (url, _):
        page = httpx.get(url + "/workers/add", timeout=30.0)
        r = run_cli("admin", "add-worker", "--coordinator", url, "--admin-token", ADMIN)
    text = " ".join(re.sub(r"<[^>]+>", " ", page.text).split()).replace("&#39;", "'")
    for said in (text, " ".join(r.output.split())):
        assert "public URL is http://127.0.0.1:8600: other machines cannot reach it" in said, said
        assert "make run HOST=0.0.0.0 PUBLIC_URL=http://<this machine's address>:8600" in said.replace(
            "&lt;", "<"
        ).replace("&gt;", ">")


def test_the_coordinator_serves_its_own_wheel(served: str) -> None:
    name = wheel_filename()
    r = httpx.get(f"{served}/downloads/{name}", timeout=30.0)
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    assert r.headers["etag"] == f'"{hashlib.sha256(r.content).hexdigest()}"'
    assert (
        httpx.get(f"{served}/downloads/{name}", headers={"If-None-Match": r.headers["etag"]},
                  timeout=30.0).status_code
        == 304
    )
    wheel = zipfile.ZipFile(io.BytesIO(r.content))
    names = set(wheel.namelist())
    root = Path(__file__).resolve().parents[2]
    sources = {
        f"kernelfleet/{p.relative_to(root).as_posix()}"
        for folder in ("service", "worker", "web", "kernels", "migrations")
        for p in (root / folder).rglob("*")
        if p.suffix in (".py", ".html", ".mako", ".css", ".js") and "__pycache__" not in p.parts
    }
    sources |= {f"kernelfleet/{p.name}" for p in (root / "kernelfleet").glob("*.py")}
    assert sources <= names, sorted(sources - names)[:10]
    info = name.split("-py3")[0] + ".dist-info"
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert 'Requires-Dist: mlx[cuda13]>=0.32.4; extra == "cuda"' in metadata
    assert "kernelfleet = kernelfleet.worker.cli:main" in wheel.read(f"{info}/entry_points.txt").decode()
    record = wheel.read(f"{info}/RECORD").decode().splitlines()
    assert len(record) == len(names) and f"{info}/RECORD,," in record
    missing = httpx.get(f"{served}/downloads/kernelfleet-9.9.9-py3-none-any.whl", timeout=30.0)
    assert missing.status_code == 404 and name in missing.json()["detail"]


def _environ(pid: int) -> list[bytes]:
    """A process's environment from /proc. Popen returns once the child's close-on-exec pipe closes,
    which execve does before it lays out the new environment: in that window the file reads empty,
    so read until the kernel has filled it (or 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        if raw or time.monotonic() > deadline:
            return raw.split(b"\0")
        time.sleep(0.05)


@pytest.mark.slow
def test_gpus_all_runs_one_enrolled_agent_per_gpu(served: str, tmp_path: Path) -> None:
    """A fake `nvidia-smi -L` lists two GPUs: `kernelfleet worker --gpus all` starts two agents, each
    with CUDA_VISIBLE_DEVICES of its GPU and a state dir of its own; both enroll with one two-use token;
    SIGTERM stops them all."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)'\n"
        "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    with admin_client(served + "/api/v1") as admin:
        token = admin.post("/enroll-tokens", json={"uses": 2}).json()["token"]
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(PATH=f"{bin_dir}:{env['PATH']}", KERNELFLEET_ENROLL_TOKEN=token)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelfleet.worker.cli",
                "worker",
                "--gpus",
                "all",
                "--coordinator",
                served,
                "--state-dir",
                str(tmp_path / "state"),
                "--name",
                "box",
                "--lease-wait",
                "0.5",
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert proc.stderr is not None
            pids = {}
            for line in proc.stderr:
                m = re.match(r"gpu (\d): worker pid (\d+) \(CUDA_VISIBLE_DEVICES=(\d),", line)
                if m:
                    pids[m[1]] = int(m[2])
                    assert m[1] == m[3]
                if len(pids) == 2:
                    break
            lines: list[str] = []  # the agents' relayed output, drained so the pipe never fills
            threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True).start()
            for gpu, pid in pids.items():
                assert f"CUDA_VISIBLE_DEVICES={gpu}".encode() in _environ(pid)
            deadline = time.monotonic() + 60
            workers: list[Any] = []
            while len(workers) < 2:
                assert time.monotonic() < deadline and proc.poll() is None, "two agents did not enroll"
                workers = admin.get("/workers").json()
                time.sleep(0.1)
            assert sorted(w["name"] for w in workers) == ["box-gpu0", "box-gpu1"]
            assert {p.name for p in (tmp_path / "state").iterdir()} == {"gpu0", "gpu1"}
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            code = proc.wait(timeout=60)
        assert code == 0
        for pid in pids.values():
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
