"""The kernels' source revision a report was measured at: the git commit of the installed package
when it is a git checkout (``-dirty`` when the kernels have uncommitted changes), else the
package's recorded version. Stdlib only; ``kernelfleet tune --revision`` overrides it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}$")  # what the coordinator accepts


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_revision(path: Path) -> str | None:
    """The commit checked out at ``path`` (``<sha>-dirty`` when files under ``path`` changed), or None
    when ``path`` is not inside a git work tree or git is missing."""
    commit = _git(path, "rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    changed = _git(path, "status", "--porcelain", "--untracked-files=no", "--", ".")
    return f"{commit}-dirty" if changed else commit


@lru_cache(maxsize=1)
def installed_revision() -> str | None:
    """This install's kernel source revision (computed once per process)."""
    spec = importlib.util.find_spec("kernelfleet.kernels")
    places = list(spec.submodule_search_locations or []) if spec else []
    revision = git_revision(Path(places[0]).resolve()) if places else None
    if revision is None:
        try:
            revision = metadata.version("kernelfleet")
        except metadata.PackageNotFoundError:
            return None
    return revision if REVISION_RE.match(revision) else None
