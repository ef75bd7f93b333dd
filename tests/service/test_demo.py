"""`make demo` / `kernelfleet demo` (issue 29, item 8): the GPU reports the repository ships
(benchmarks/results/*_tuning.jsonl: an H100 and an H200) go into a dashboard beside this machine's CPU,
whose small campaign the local worker tunes; and a CPU-only dashboard, where every speedup is 1.00x,
points to them. In-thread coordinator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from coordinator_helpers import make_report
from inproc import fast_settings, run_cli, serve_in_thread

from kernelfleet.service import demo

ADMIN = "kfa_test-admin"
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def served(migrated_db_url: str) -> Iterator[str]:
    with serve_in_thread(fast_settings(migrated_db_url)) as (url, _):
        yield url


def test_the_shipped_reports_all_load() -> None:
    reports = demo.load(demo.default_reports(ROOT))
    assert len(reports) > 500
    assert {r["env"]["chip"] for r in reports} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}


def test_demo_fills_two_gpu_chips_and_queues_this_machine_s_cpu(served: str) -> None:
    reports = demo.load([RESULTS / "h100_tuning.jsonl", RESULTS / "h200_tuning.jsonl"])
    imported, chips, queued = demo.fill(served, ADMIN, reports)
    assert (imported, chips, queued) == (len(reports), ["NVIDIA H100 80GB HBM3", "NVIDIA H200"], True)
    page = httpx.get(served + "/chips", timeout=30.0).text
    assert "NVIDIA H100 80GB HBM3" in page and "NVIDIA H200" in page and 'id="cpu-note"' not in page
    with httpx.Client(base_url=served + "/api/v1", headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        (campaign,) = admin.get("/campaigns").json()
    assert campaign["name"] == demo.CPU_CAMPAIGN and campaign["target_backend"] == "cpu"
    assert campaign["progress"]["total"] == 4
    assert demo.fill(served, ADMIN, reports) == (0, chips, False)  # again: nothing twice


def test_a_cpu_only_dashboard_points_to_the_gpu_reports(served: str) -> None:
    cpu = make_report(chip="Intel Xeon Platinum 8480", backend="cpu", median=50.0)
    with httpx.Client(base_url=served + "/api/v1", headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        assert admin.post("/results/import", json={"reports": [cpu]}).status_code == 201
        for path in ("/", "/chips", "/chips/Intel%20Xeon%20Platinum%208480"):
            page = httpx.get(served + path, timeout=30.0).text
            assert 'id="cpu-note"' in page and "make demo" in page and "every speedup is 1.00x" in page, path
        assert admin.post("/results/import", json={"reports": [make_report()]}).status_code == 201  # a GPU
    assert 'id="cpu-note"' not in httpx.get(served + "/", timeout=30.0).text
    assert 'id="cpu-note"' in httpx.get(served + "/chips/Intel%20Xeon%20Platinum%208480", timeout=30.0).text


def test_demo_without_reports_says_where_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = run_cli("demo")
    assert r.exit_code == 1 and "no reports to show" in r.output and "benchmarks/results/" in r.output
