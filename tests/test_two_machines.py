"""Two "machines" on this host: a coordinator, and a second machine that installs KernelFleet only from
what `kernelfleet admin add-worker` prints (the wheel the coordinator serves), enrolls, tunes a job on
its CPU and reports to the first through the coordinator's public address.

Isolation, as root (CI): each machine is a network namespace of its own, joined by a veth pair
(10.<a>.<b>.1 and .2); the coordinator listens on its veth address only and names it as its public
URL, and the second machine has nothing else to reach (its loopback holds nothing). The second machine
runs as the user ``nobody``, with a home, a working directory and a virtualenv of its own made with the
system's Python. The one allowance: there is no network to a package index, so its virtualenv gets the
dependencies (not KernelFleet) from this test environment's site-packages through a ``.pth`` file,
and its ``pip install`` of the page's URL runs with ``--no-deps --no-index``. Without root (or without
``ip netns``), it falls back to the loopback and the current user, with the same separate home and
virtualenv, and says so in the test's output."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from inproc import free_port, stop_group

from kernelfleet.service.migrate import upgrade

ADMIN = "kfa_" + secrets.token_urlsafe(16)


@dataclass
class Machines:
    coordinator_ip: str
    a: list[str] = field(default_factory=list)  # command prefix that runs on machine A
    b: list[str] = field(default_factory=list)  # ... on machine B (its own netns, and user)
    b_user: str | None = None
    isolation: str = "loopback only (no root or no `ip netns`): separate home and virtualenv"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def machines() -> Iterator[Machines]:
    """Two network namespaces joined by a veth pair, or (without root) the loopback."""
    usable = os.geteuid() == 0 and shutil.which("ip") is not None
    if not usable:
        yield Machines("127.0.0.1")
        return
    tag = secrets.token_hex(3)
    a, b = f"kf-a-{tag}", f"kf-b-{tag}"
    octets = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250)}"
    made: list[str] = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", f"kfa{tag}", "netns", a, "type", "veth", "peer", "name", f"kfb{tag}", "netns", b)
        for ns, dev, host in ((a, f"kfa{tag}", 1), (b, f"kfb{tag}", 2)):
            _ip("-n", ns, "addr", "add", f"{octets}.{host}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
    except subprocess.CalledProcessError as e:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"network namespaces unavailable here: {e.stderr!r}")
    user = "nobody" if shutil.which("runuser") else None
    try:
        yield Machines(
            f"{octets}.1",
            ["ip", "netns", "exec", a],
            ["ip", "netns", "exec", b] + (["runuser", "-u", user, "--"] if user else []),
            user,
            "two network namespaces joined by a veth pair; machine B runs as "
            f"{user or 'root'} with its own home and virtualenv",
        )
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def system_python() -> str:
    """Machine B's Python: the system's (readable by any user) when it is this interpreter's version,
    so this environment's compiled dependencies load in it; else this interpreter's base."""
    candidate = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin")
    return candidate or getattr(sys, "_base_executable", sys.executable)


def run(
    prefix: list[str], command: str | list[str], env: dict[str, str], cwd: Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    argv = ["bash", "-c", command] if isinstance(command, str) else command
    r = subprocess.run(
        [*prefix, "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, f"{command}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_a_second_machine_installs_from_the_add_worker_commands_and_reports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = Path(tempfile.mkdtemp(prefix="kf-two-machines-"))
    root.chmod(0o755)
    server = None
    try:
        with machines() as m:
            with capsys.disabled():
                print(f"\n[two machines] isolation: {m.isolation}")
            a_home, b_home = root / "a", root / "b"
            a_home.mkdir()
            b_home.mkdir()
            if m.b_user:
                shutil.chown(b_home, m.b_user)
            here = sys.executable
            a_env = {
                "HOME": str(a_home),
                "PATH": os.environ["PATH"],
                "KERNELFLEET_ADMIN_TOKEN": ADMIN,
                "KERNELFLEET_DATABASE_URL": f"sqlite:///{a_home / 'kf.db'}",
                "PYTHONUNBUFFERED": "1",
                "KERNELFLEET_BACKGROUND_INTERVAL_SECONDS": "0.2",
            }
            kf = [here, "-m", "kernelfleet.worker.cli"]
            upgrade(a_env["KERNELFLEET_DATABASE_URL"])  # `kernelfleet db upgrade`, in this process
            port = 8600 if m.a else free_port()
            public = f"http://{m.coordinator_ip}:{port}"
            server = subprocess.Popen(
                [
                    *m.a,
                    "env",
                    "-i",
                    *[f"{k}={v}" for k, v in a_env.items()],
                    *kf,
                    "serve",
                    "--host",
                    m.coordinator_ip,
                    "--port",
                    str(port),
                    "--public-url",
                    public,
                ],
                cwd=a_home,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            assert server.stdout is not None
            seen = []
            for line in server.stdout:  # the event: uvicorn has bound the public address
                seen.append(line)
                if "Uvicorn running on" in line:
                    break
            else:
                raise AssertionError("the coordinator did not start:\n" + "".join(seen))

            # on machine A (the server): a small CPU campaign, and the Add a worker commands
            api(
                m,
                a_env,
                a_home,
                public,
                "POST",
                "/campaigns",
                {
                    "name": "second machine",
                    "kernels": ["rmsnorm"],
                    "shapes": ["32x256"],
                    "dtypes": ["float32"],
                    "target_backend": "cpu",
                },
            )
            printed = run(m.a, [*kf, "admin", "add-worker", "--coordinator", public], a_env, a_home).stdout
            linux = printed[printed.index("Linux (NVIDIA GPU, CUDA)") :]
            venv_line = next(
                line.strip().removeprefix("#").strip()
                for line in linux.splitlines()
                if "python3 -m venv" in line
            )
            create, install, start = venv_line.split(" && ")
            assert create == "python3 -m venv ~/.kernelfleet", create
            wheel = re.search(r"@ (http://\S+\.whl)", install)
            assert wheel and wheel.group(1).startswith(public + "/downloads/"), install
            assert start.startswith(
                f"~/.kernelfleet/bin/kernelfleet worker --coordinator {public} --enroll-token kfe_"
            ), start

            # on machine B: exactly those commands, with the allowance for having no package index
            deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
            b_env = {"HOME": str(b_home), "PATH": "/usr/local/bin:/usr/bin:/bin"}
            python = system_python()
            run(m.b, create.replace("python3 -m venv", f"{python} -m venv --without-pip"), b_env, b_home)
            site = run(
                m.b,
                "~/.kernelfleet/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'",
                b_env,
                b_home,
            ).stdout.strip()
            run(
                m.b,
                f"printf '%s\\n' {' '.join(shlex.quote(d) for d in deps)} > {site}/_no_index_deps.pth",
                b_env,
                b_home,
            )
            run(
                m.b,
                install.replace(
                    "~/.kernelfleet/bin/pip install",
                    "~/.kernelfleet/bin/python -m pip install -q --no-deps --no-index",
                ),
                b_env,
                b_home,
            )
            origin = run(
                m.b,
                "cd ~ && ~/.kernelfleet/bin/python -c 'import importlib.util as u; "
                'print(u.find_spec("kernelfleet.worker.cli").origin)\'',
                b_env,
                b_home,
            ).stdout.strip()
            assert origin.startswith(site + "/kernelfleet/"), origin  # the served wheel, not this checkout
            worked = run(m.b, f"cd ~ && {start} --max-jobs 1 --lease-wait 2", b_env, b_home)
            assert "worker stopped after 1 job" in worked.stderr, worked.stderr[-3000:]

            # back on A: the job is done by the second machine's worker, its result stored
            (job,) = api(m, a_env, a_home, public, "GET", "/jobs")
            assert job["state"] == "done" and job["leased_by"] is not None, job
            (worker,) = api(m, a_env, a_home, public, "GET", "/workers")
            assert worker["id"] == job["leased_by"] and worker["backend"] == "cpu"
            (result,) = api(m, a_env, a_home, public, "GET", "/results")["items"]
            assert result["chip"] == worker["chip"] and result["source"] == "lease"
            if m.a:  # machine B reaches A only at its public address: nothing listens on B's loopback
                alone = subprocess.run(
                    [
                        *m.b,
                        "env",
                        "-i",
                        *[f"{k}={v}" for k, v in b_env.items()],
                        "bash",
                        "-c",
                        f'~/.kernelfleet/bin/python -c "import httpx; '
                        f"httpx.get('http://127.0.0.1:{port}/healthz', timeout=2)\"",
                    ],
                    cwd=b_home,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert alone.returncode != 0 and "ConnectError" in alone.stderr
    finally:
        if server is not None:
            stop_group(server)
        shutil.rmtree(root, ignore_errors=True)


def api(
    m: Machines, env: dict[str, str], cwd: Path, public: str, method: str, path: str, body: object = None
) -> Any:
    """One admin API call made on machine A (where the test process cannot reach), as JSON."""
    code = (
        "import httpx, json, sys; r = httpx.request(sys.argv[1], sys.argv[2], json=json.loads(sys.argv[3]), "
        "headers={'Authorization': 'Bearer ' + sys.argv[4]}, timeout=60); r.raise_for_status(); "
        "print(r.text)"
    )
    got = run(
        m.a,
        [sys.executable, "-c", code, method, public + "/api/v1" + path, json.dumps(body), ADMIN],
        env,
        cwd,
    )
    return json.loads(got.stdout)
