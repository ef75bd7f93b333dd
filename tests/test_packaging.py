"""The built wheel installs into a fresh virtualenv and every package imports from it, outside the
repository (no editable install, no source tree on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "worker", "web", "kernels", "migrations")


# kernelfleet.patch / unpatch load lazily: importing kernelfleet.service imports neither mlx-lm nor the
# patch module; asking for kernelfleet.patch does
LAZY_PATCH = (
    "import sys, kernelfleet, kernelfleet.service\n"
    "assert 'mlx_lm' not in sys.modules and 'kernelfleet.kernels.patch.model_patch' not in sys.modules\n"
    "from kernelfleet import patch, unpatch\n"
    "assert patch.__module__ == unpatch.__module__ == 'kernelfleet.kernels.patch.model_patch'\n"
    "print('patch from', sys.modules['kernelfleet.kernels.patch.model_patch'].__file__)\n"
)


def test_editable_install_imports_kernelfleet_patch(tmp_path: Path) -> None:
    """The development install (``pip install -e``, as ``make venv`` does) serves ``kernelfleet.patch``
    from the repository, outside its folder too."""
    code = LAZY_PATCH + "import kernelfleet.worker.cli, kernelfleet.web\n"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"patch from {ROOT / 'kernels' / 'patch' / 'model_patch.py'}" in r.stdout


@pytest.mark.slow
def test_wheel_installs_and_imports_outside_the_repo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                            "--outdir", str(dist)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = next(dist.glob("kernelfleet-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top_level = [n for n in names if n.split("/")[0] in PACKAGES]
    assert not top_level, "nothing generic may land at the top of site-packages"
    sources = [p.relative_to(ROOT) for folder in PACKAGES for p in (ROOT / folder).rglob("*")
               if p.suffix in (".py", ".html", ".mako") and "__pycache__" not in p.parts]
    missing = [str(s) for s in sources if f"kernelfleet/{s.as_posix()}" not in names]
    missing += [str(p.relative_to(ROOT)) for p in (ROOT / "kernelfleet").glob("*.py")
                if f"kernelfleet/{p.name}" not in names]  # the top-level package: kernelfleet.patch
    assert not missing, f"files missing from the wheel (list their packages in pyproject.toml): {missing}"
    assert {"kernelfleet/__init__.py", "kernelfleet/zmlx.py"} <= set(names)  # the top package, kernelfleet/

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    target = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    # install the wheel alone into the fresh venv; its dependencies come from this environment's
    # site-packages, appended after the venv's own (offline, and no editable finder is loaded)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target,
                    str(wheel)], check=True, capture_output=True, timeout=300)
    deps = sysconfig.get_paths()["purelib"]
    prelude = f"import sys; sys.path.append({deps!r})\n"
    code = prelude + (
        "import kernelfleet.service.app, kernelfleet.worker.cli, kernelfleet.web, kernelfleet.kernels, "
        "kernelfleet.migrations, kernelfleet.zmlx\n"
        "import kernelfleet.service as s; print(s.__file__)\n"
        + LAZY_PATCH
    )
    r = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(target), r.stdout
    assert f"patch from {target}/kernelfleet/kernels/patch/model_patch.py" in r.stdout, r.stdout
    main = prelude + "sys.argv = ['kernelfleet', '--help']\nfrom kernelfleet.worker.cli import main; main()\n"
    cli = subprocess.run([str(py), "-c", main],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and "serve" in cli.stdout, cli.stderr
    # run from inside a clone (whose kernelfleet/ folder holds only the top package's files), the
    # worker's own child processes still import the installed package: a runtime-settings step here
    # (`python -m` puts the working directory first on sys.path; -P leaves it out)
    step = prelude + (
        "from kernelfleet.worker.runtime_settings.search import Objective\n"
        "from kernelfleet.worker.runtime_settings.sides import run_step\n"
        "from kernelfleet.kernels.patch.model_build import TINY\n"
        "goal = Objective(TINY['llama'], 'float32', None, ('decode:1',), context=8, steps=2, reps=1)\n"
        "req = goal.request()\n"
        "print(sorted(run_step(req, {}, 300)['seconds']))\n"
    )
    ran = subprocess.run([str(py), "-P", "-c", step], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": deps})
    assert ran.returncode == 0 and "['decode:1']" in ran.stdout, ran.stderr[-3000:]
