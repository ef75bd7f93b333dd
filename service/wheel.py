"""The coordinator's own wheel, so a new machine installs the worker from the coordinator itself (no
package-index release needed): ``GET /downloads/kernelfleet-<version>-py3-none-any.whl``.

The wheel is made from the running installation, whatever its kind: the files of the imported
``kernelfleet`` packages (an editable checkout's folders, or site-packages after ``pip install .``)
and the installed distribution's metadata (requirements with their markers and extras, the
``kernelfleet`` entry point). It is built once per process, deterministically (fixed timestamps, sorted
entries), so every process and replica serves the same bytes under the same ETag.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

DIST = "kernelfleet"
# the top-level package and the folders mapped into it (pyproject.toml's package-dir)
SUBPACKAGES = ("service", "worker", "web", "kernels", "migrations")
TAG = "py3-none-any"
EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest time: the same files give the same bytes
SKIP_SUFFIXES = (".pyc", ".pyo")


class WheelUnavailable(Exception):
    """This coordinator runs without an installed ``kernelfleet`` distribution (no metadata)."""


@dataclass(frozen=True)
class Wheel:
    filename: str
    data: bytes
    sha256: str
    version: str


def _folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WheelUnavailable(f"package {package} is not importable here")
    return Path(list(spec.submodule_search_locations)[0])


def package_files() -> dict[str, Path]:
    """wheel path -> file, for every source and data file of the installed packages."""
    top = _folder(DIST)
    files = {f"{DIST}/{p.name}": p for p in top.iterdir() if p.is_file() and p.suffix not in SKIP_SUFFIXES}
    for sub in SUBPACKAGES:
        root = _folder(f"{DIST}.{sub}")
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in SKIP_SUFFIXES:
                files[f"{DIST}/{sub}/{path.relative_to(root).as_posix()}"] = path
    return files


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build() -> Wheel:
    try:
        dist = distribution(DIST)
    except PackageNotFoundError as e:
        raise WheelUnavailable("no installed kernelfleet distribution: install it (pip install -e .) "
                               "to serve its wheel") from e
    version = dist.version
    info = f"{DIST}-{version}.dist-info"
    metadata = dist.read_text("METADATA")
    if not metadata:
        raise WheelUnavailable("the installed kernelfleet distribution has no METADATA")
    contents: dict[str, bytes] = {name: path.read_bytes() for name, path in package_files().items()}
    contents[f"{info}/METADATA"] = metadata.encode()
    contents[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kernelfleet coordinator\n"
                                 f"Root-Is-Purelib: true\nTag: {TAG}\n").encode()
    contents[f"{info}/entry_points.txt"] = (dist.read_text("entry_points.txt") or "").encode()
    contents[f"{info}/top_level.txt"] = f"{DIST}\n".encode()
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(contents.items())]
    contents[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name in sorted(contents, key=lambda n: (n.startswith(info), n)):  # dist-info last
            entry = zipfile.ZipInfo(name, EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, contents[name])
    data = buffer.getvalue()
    return Wheel(f"{DIST}-{version}-{TAG}.whl", data, hashlib.sha256(data).hexdigest(), version)


@lru_cache(maxsize=1)
def current() -> Wheel:
    """This process's wheel, built on first use."""
    return build()


def wheel_filename() -> str:
    """The served wheel's file name (without building it)."""
    try:
        version = distribution(DIST).version
    except PackageNotFoundError as e:
        raise WheelUnavailable("no installed kernelfleet distribution") from e
    return f"{DIST}-{version}-{TAG}.whl"
