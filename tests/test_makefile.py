"""The Makefile's promises, read from `make -n` (what it would run) with a virtualenv that does not
exist yet: `make run` and `make demo` install KernelFleet without the dev toolchain (issue 29, item 7:
`make run` built a 1.1 GB venv of Playwright, NVRTC, transformers and mypy) and say how to reach
`kernelfleet`; `make test` installs the dev tools; `make demo` shows the shipped GPU reports (item 8);
`make run` serves on the LAN with HOST and PUBLIC_URL."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target: str, tmp_path: Path, *assignments: str) -> list[str]:
    r = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", *assignments], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def installs(lines: list[str]) -> list[str]:
    return [ln for ln in lines if "pip install" in ln and "--upgrade pip" not in ln]


@pytest.mark.parametrize("target", ["run", "demo"])
def test_run_and_demo_install_only_what_the_service_needs(target: str, tmp_path: Path) -> None:
    lines = dry_run(target, tmp_path)
    (install,) = installs(lines)
    assert install.endswith("pip install -q -e .") and "[dev]" not in install, install
    said = next(ln for ln in lines if "kernelfleet is at" in ln)
    bin_dir = tmp_path / "venv" / "bin"
    assert f"source {bin_dir}/activate" in said and f'export PATH="{bin_dir}:$PATH"' in said


def test_test_installs_the_dev_tools(tmp_path: Path) -> None:
    (install,) = installs(dry_run("test", tmp_path))
    assert install.endswith("pip install -q -e '.[dev]'"), install


def test_demo_shows_the_shipped_gpu_reports(tmp_path: Path) -> None:
    (command,) = [ln for ln in dry_run("demo", tmp_path) if "kernelfleet demo" in ln]
    results = ROOT / "benchmarks" / "results"
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in results.glob("*_tuning.jsonl"))
    assert shipped and all(f" {p} " in f" {command} " for p in shipped)
    assert any(p.startswith("benchmarks/results/h100") for p in shipped)
    assert any(p.startswith("benchmarks/results/h200") for p in shipped)


def test_run_on_the_lan(tmp_path: Path) -> None:
    (serve,) = [ln for ln in dry_run("run", tmp_path, "HOST=0.0.0.0", "PUBLIC_URL=http://10.0.0.5:8600")
                if "kernelfleet serve" in ln]
    assert "--host 0.0.0.0" in serve and "--public-url http://10.0.0.5:8600" in serve
