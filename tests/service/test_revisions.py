"""Source revisions end to end: ``kernelfleet tune`` records this checkout's git commit (or
``--revision``), the coordinator stores it with the run, the compare page shows each side's
revisions, and its CSV download link returns the compared runs."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path

from conftest import Coordinator, kernelfleet_cmd
from coordinator_helpers import make_report

from kernelfleet.worker.revision import git_revision

REPO = Path(__file__).resolve().parents[2]


def _tune(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kernelfleet_cmd("tune", "rmsnorm", "--shape", "4x256", "--dtype", "float32",
                                          "--strategy", "exhaustive", "--json", *extra),
                          capture_output=True, text=True, timeout=300)


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_git_revision_of_a_checkout(tmp_path: Path) -> None:
    assert git_revision(tmp_path) is None  # not a git work tree
    _git(tmp_path, "init", "-q")
    (tmp_path / "k.py").write_text("x = 1\n")
    _git(tmp_path, "add", "k.py")
    _git(tmp_path, "commit", "-qm", "k")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_revision(tmp_path) == head
    (tmp_path / "k.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == f"{head}-dirty"


def test_tune_records_the_revision_and_compare_shows_it(coordinator: Coordinator) -> None:
    own = _tune()
    assert own.returncode == 0, own.stderr
    report = json.loads(own.stdout)
    head = _git(REPO, "rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", report["revision"]) and report["revision"].startswith(head)
    given = _tune("--revision", "v1.2.3+local")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["revision"] == "v1.2.3+local"
    bad = _tune("--revision", "not a commit")
    assert bad.returncode == 2 and "--revision 'not a commit'" in bad.stderr and "Traceback" not in bad.stderr

    # stored with the run (the real report from this machine), and filterable
    with coordinator.admin() as admin:
        assert admin.post("/results/import", json={"reports": [report]}).status_code == 201
        a = dict(make_report(chip="Apple M2", backend="metal"), revision="abc123def456789")
        b = dict(make_report(chip="Apple M3", backend="metal", median=8.0), revision="fed987")
        assert admin.post("/results/import", json={"reports": [a, b]}).status_code == 201
    with coordinator.client() as c:
        mine = c.get("/results", params={"revision": report["revision"]}).json()["items"]
        assert [(r["chip"], r["kernel"], r["shape"]) for r in mine] == [
            (report["env"]["chip"], "rmsnorm", "4x256")]

    # the compare page names each side's revision and links to the compared runs as CSV and JSON
    with coordinator.client() as c:
        base = coordinator.url
        page = c.get(base + "/compare", params={"a": "Apple M2", "b": "Apple M3"})
        assert page.status_code == 200, page.text
        html = page.text
        assert "Apple M2 at abc123def456789; Apple M3 at fed987" in html
        assert 'title="abc123def456789">@abc123def456<' in html and ">@fed987<" in html
        link = re.search(r'href="(/api/v1/results\?[^"]*format=csv)"', html)
        assert link is not None
        got = c.get(base + link.group(1).replace("&amp;", "&"))
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(got.text)))
        assert sorted((r["chip"], r["revision"]) for r in rows) == [
            ("Apple M2", "abc123def456789"), ("Apple M3", "fed987")]
        for path in ("/chips/Apple%20M2", "/kernels/rmsnorm"):
            html = c.get(base + path).text
            links = re.findall(r'href="(/api/v1/results\?[^"]*)" download', html)
            assert len(links) == 2, path
            data = c.get(base + links[1].replace("&amp;", "&")).json()  # the JSON one
            assert data["items"] and all(r["kernel"] == "rmsnorm" for r in data["items"])
