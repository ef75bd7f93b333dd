"""The coordinator image's build context, built the way the Dockerfile builds it: exactly the files its
COPY lines copy, installed with its ``pip install .`` into a fresh virtualenv (not editable, no source
tree on the path), then its CMD (``kernelfleet serve``) started from that install answers /healthz and
the dashboard. There is no Docker engine here: this is the part of ``docker compose build`` that can
break through our files (pyproject's package-dir naming a folder the image lacks).

The fresh venv gets no dependencies from the network: a ``.pth`` file appends this test environment's
site-packages after the venv's own (as ``--system-site-packages`` would, for a base interpreter), so
``pip install --no-deps --no-build-isolation --no-index`` builds and installs only KernelFleet."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest
from inproc import free_port, stop_group

ROOT = Path(__file__).resolve().parents[1]


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile line, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def build_context(into: Path) -> Path:
    """Copy what the Dockerfile's COPY lines copy (before its ``pip install``) to where they land under
    its WORKDIR; returns the folder ``pip install .`` runs in."""
    workdir = None
    for op, args in dockerfile():
        if op == "WORKDIR" and workdir is None:
            workdir = args
        if op == "COPY":
            assert workdir is not None and not args.startswith("--"), f"unexpected COPY {args}"
            *sources, dest = shlex.split(args)
            target = into / dest.removeprefix("./") if dest not in (".", "./") else into
            for source in sources:
                src = ROOT / source
                assert src.exists(), f"the Dockerfile copies {source}, which does not exist"
                if src.is_dir():
                    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                                    dirs_exist_ok=True)
                else:
                    (target if dest.endswith("/") else target.parent).mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, target / src.name if dest.endswith("/") else target)
        if op == "RUN" and "pip install" in args:
            assert re.search(r"pip install \.(\s|$)", args), f"expected `pip install .` in the image: {args}"
            return into
    raise AssertionError("the Dockerfile has no `RUN pip install .`")


def image_cmd() -> list[str]:
    (cmd,) = [json.loads(args) for op, args in dockerfile() if op == "CMD"]
    assert isinstance(cmd, list)
    return [str(c) for c in cmd]


def with_option(cmd: list[str], name: str, value: str) -> list[str]:
    if name in cmd:
        i = cmd.index(name)
        return [*cmd[:i + 1], value, *cmd[i + 2:]]
    return [*cmd, name, value]


@pytest.mark.slow
def test_image_build_context_installs_and_serves(tmp_path: Path) -> None:
    context = build_context(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_kernelfleet_test_deps.pth").write_text("\n".join(sorted(here)) + "\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "."], cwd=context, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELFLEET_", "PYTHON"))}
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
               KERNELFLEET_DATABASE_URL=f"sqlite:///{home / 'kf.db'}",
               KERNELFLEET_ADMIN_TOKEN="kfa_image-test")
    where = subprocess.run(["kernelfleet", "--version"], cwd=home, env=env, capture_output=True, text=True,
                           timeout=120)
    assert where.returncode == 0 and "kernelfleet 0." in where.stdout, where.stderr
    origin = subprocess.run([str(py), "-c", "import kernelfleet.service.app as m; print(m.__file__)"],
                            cwd=home, env=env, capture_output=True, text=True, timeout=120)
    # the install, not the repository
    assert origin.stdout.strip().startswith(purelib), origin.stdout + origin.stderr
    upgrade = subprocess.run(["kernelfleet", "db", "upgrade"], cwd=home, env=env, capture_output=True,
                             text=True, timeout=120)
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr  # the migrations are in the install

    port = free_port()
    cmd = with_option(with_option(image_cmd(), "--host", "127.0.0.1"), "--port", str(port))
    assert cmd[:2] == ["kernelfleet", "serve"], cmd
    log = tmp_path / "serve.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=home, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 200, log.read_text()
        assert health.json()["status"] == "ok"
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10.0)  # templates and static files installed
        assert page.status_code == 200 and "KernelFleet" in page.text
        assert httpx.get(f"http://127.0.0.1:{port}/static/dashboard.css", timeout=10.0).status_code == 200
        # the wheel a new worker installs (Add a worker), made from this non-editable install
        add = httpx.get(f"http://127.0.0.1:{port}/workers/add", timeout=10.0)
        (wheel_url,) = set(re.findall(r"http://\S+/downloads/kernelfleet-[\w.]+-py3-none-any\.whl", add.text))
        wheel = httpx.get(wheel_url, timeout=30.0)
        assert wheel.status_code == 200, wheel.text[:300]
        names = zipfile.ZipFile(io.BytesIO(wheel.content)).namelist()
        assert {"kernelfleet/service/app.py", "kernelfleet/web/templates/base.html",
                "kernelfleet/migrations/versions/0001_initial_schema.py"} <= set(names)
    finally:
        stop_group(proc)
