"""Schemathesis fuzzes the coordinator over its own OpenAPI schema, against a real ``kernelfleet
serve`` (SQLite, and PostgreSQL when configured), with the admin token and a worker's token: every
phase (examples, coverage, fuzzing, stateful), positive and negative data, and no server error, no
undeclared status, no response that breaks its declared schema or content type, no invalid input
accepted.

Cost is bounded: ``KERNELFLEET_FUZZ_EXAMPLES`` cases per operation and phase (default 10) and a
seed that changes every day (``KERNELFLEET_FUZZ_SEED`` replays one); the seed and what was covered
are printed (``pytest -s``)."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll, lease, make_report

pytestmark = pytest.mark.slow

CHECKS = ",".join((
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
))
WORKER_ROUTES = r"^/api/v1/(leases|workers/me|jobs/[^/]+/(heartbeat|result|fail|release))$"
CHIP = "NVIDIA H100 80GB HBM3"


def _seed() -> int:
    return int(os.environ.get("KERNELFLEET_FUZZ_SEED") or datetime.date.today().strftime("%Y%m%d"))


def _config(admin: str, worker: str, offered: dict[str, int | str], fixed: dict[str, int]) -> str:
    """schemathesis.toml: the admin token everywhere but on the worker's routes; the ids of real rows
    offered for path parameters half of the time (so cases reach past the 404s); ``fixed`` path
    parameters always take their value (a fixed value holds in every phase)."""
    lines = [f"headers = {{ Authorization = {json.dumps('Bearer ' + admin)} }}", ""]
    for name, value in offered.items():
        lines += [f"[dictionaries.{name}]", f"values = [{json.dumps(value)}]", ""]
    lines.append("[parameters]")
    lines += [f'"path.{name}" = {{ dictionary = "{name}", probability = 0.5 }}' for name in offered]
    lines += [f'"path.{name}" = {value}' for name, value in fixed.items()]
    lines += ["", "[[operations]]", f"include-path-regex = {json.dumps(WORKER_ROUTES)}",
              f"headers = {{ Authorization = {json.dumps('Bearer ' + worker)} }}", ""]
    return "\n".join(lines)


def test_schemathesis_finds_no_server_errors_or_schema_violations(coordinator_factory: Any,
                                                                  tmp_path: Path) -> None:
    # a lease request may long-poll up to the coordinator's cap when nothing is queued: keep the cap
    # short, or every generated `wait_seconds` makes a 20 s request
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_LEASE_WAIT_MAX_SECONDS="0.2")
    campaign = create_campaign(coordinator, shapes=["1x64", "2x64", "3x64"])
    _, worker = enroll(coordinator, "fuzzer")
    victim_id, _ = enroll(coordinator, "victim")  # POST /workers/{id}/revoke revokes this one, not the fuzzer
    with coordinator.client(worker) as c:
        held = lease(c)
    assert held is not None
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [make_report(chip=CHIP)]})
        assert r.status_code == 201, r.text
    offered: dict[str, int | str] = {"job_id": held["job_id"], "campaign_id": campaign["id"], "chip": CHIP}
    config = _config(coordinator.admin_token, worker, offered, {"worker_id": victim_id})
    (tmp_path / "schemathesis.toml").write_text(config)

    seed = _seed()
    examples = int(os.environ.get("KERNELFLEET_FUZZ_EXAMPLES", "10"))
    st = Path(sys.executable).parent / "st"
    cmd = [str(st), "--config-file", str(tmp_path / "schemathesis.toml"), "run",
           f"{coordinator.url}/openapi.json", "--checks", CHECKS, "--max-examples", str(examples),
           "--seed", str(seed), "--workers", "1", "--no-color", "--output-truncate", "false",
           "--report", "junit", "--report-dir", str(tmp_path / "report")]
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    took = time.monotonic() - started
    out = run.stdout + run.stderr
    cases = re.search(r"Test cases:\s*\n\s*(\d+) generated, (\d+) passed", out)
    summary = cases.group(0).split(":", 1)[1].strip() if cases else "no summary"
    print(f"\nschemathesis seed {seed}, {examples} examples per operation: {summary} in {took:.0f} s "
          f"({coordinator.db_url.split(':')[0]})\n{out[-3000:]}")
    assert run.returncode == 0, f"schemathesis found problems (seed {seed}):\n{out[-20000:]}"
    assert cases is not None and int(cases.group(1)) == int(cases.group(2)) > 0, out[-5000:]
    assert "Selected: 30/30" in out and "Tested: 30" in out, out[-5000:]
    assert "Traceback" not in coordinator.logs(), coordinator.logs()[-5000:]
