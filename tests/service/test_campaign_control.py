"""Campaign control through a real coordinator: cancel and delete (queued jobs cancelled, a running
job finishes and its result is kept; a deleted campaign's row goes once it has), retry of dead jobs
and of runs with no successful trial, the warning when no enrolled worker matches, and the admin
CLI for each."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
from click.testing import Result
from conftest import Coordinator, kernelfleet_cmd
from coordinator_helpers import complete, create_campaign, enroll, lease, make_report, shapes
from inproc import run_cli

H100 = "NVIDIA H100 80GB HBM3"


def _campaign(coordinator: Coordinator, campaign_id: int) -> httpx.Response:
    with coordinator.admin() as admin:
        return admin.get(f"/campaigns/{campaign_id}")


def _jobs(coordinator: Coordinator, campaign_id: int) -> list[dict[str, Any]]:
    with coordinator.admin() as admin:
        return list(admin.get("/jobs", params={"campaign_id": campaign_id}).json())


def _wait(what: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_cancel_and_delete_keep_running_results(coordinator: Coordinator) -> None:
    _, token = enroll(coordinator)
    worker = coordinator.client(token)
    c = create_campaign(coordinator, shapes=shapes(3))
    assert c["warnings"] == [] and c["cancelled_at"] is None
    running = lease(worker)
    assert running is not None
    with coordinator.admin() as admin:
        r = admin.post(f"/campaigns/{c['id']}/cancel")
        assert r.status_code == 200, r.text
        assert (r.json()["cancelled"], r.json()["running"]) == (2, 1)
        assert admin.post(f"/campaigns/{c['id']}/cancel").json()["cancelled"] == 0  # idempotent
    shown = _campaign(coordinator, c["id"]).json()
    assert shown["cancelled_at"] is not None
    assert {k: shown["progress"][k] for k in ("queued", "leased", "cancelled")} == {
        "queued": 0, "leased": 1, "cancelled": 2}
    assert lease(worker) is None  # nothing left to lease
    done = complete(worker, running)
    assert done.status_code == 201, done.text  # the running job finished; its result is stored
    with coordinator.client() as anon:
        rows = anon.get("/results").json()["items"]
    assert [(r["id"], r["job_id"]) for r in rows] == [(done.json()["result_id"], running["job_id"])]

    # a job leased before the cancel that comes back to the queue (released) is cancelled by the sweep
    c2 = create_campaign(coordinator, name="c2", shapes=shapes(2))
    held = lease(worker)
    assert held is not None and held["job_id"] in {j["id"] for j in _jobs(coordinator, c2["id"])}
    with coordinator.admin() as admin:
        assert admin.post(f"/campaigns/{c2['id']}/cancel").json()["running"] == 1
    r = worker.post(f"/jobs/{held['job_id']}/release", json={"lease_token": held["lease_token"]})
    assert r.status_code == 200, r.text
    _wait(lambda: all(j["state"] == "cancelled" for j in _jobs(coordinator, c2["id"])))

    # delete with a running job: hidden now, gone once the job finished; the result stays
    c3 = create_campaign(coordinator, name="c3", shapes=shapes(2))
    job = lease(worker)
    assert job is not None
    with coordinator.admin() as admin:
        r = admin.delete(f"/campaigns/{c3['id']}")
        assert r.status_code == 200, r.text
        assert (r.json()["cancelled"], r.json()["running"], r.json()["deleted"]) == (1, 1, False)
        assert admin.delete(f"/campaigns/{c3['id']}").status_code == 404
        assert c3["id"] not in [x["id"] for x in admin.get("/campaigns").json()]
    assert _campaign(coordinator, c3["id"]).status_code == 404
    finished = complete(worker, job)
    assert finished.status_code == 201, finished.text
    _wait(lambda: not _jobs(coordinator, c3["id"]))  # the sweep removed the campaign and its jobs
    with coordinator.client() as anon:
        kept = {r["id"]: r["job_id"] for r in anon.get("/results").json()["items"]}
    assert kept[finished.json()["result_id"]] is None  # kept, no longer tied to a job

    # delete with nothing running: gone at once; unknown ids: 404 with a JSON detail
    c4 = create_campaign(coordinator, name="c4")
    with coordinator.admin() as admin:
        assert admin.delete(f"/campaigns/{c4['id']}").json()["deleted"] is True
        for call in (admin.post("/campaigns/999999/cancel"), admin.delete("/campaigns/999999"),
                     admin.post("/campaigns/999999/retry"), admin.post(f"/campaigns/{c4['id']}/retry")):
            assert call.status_code == 404 and "does not exist" in call.json()["detail"]
        assert admin.post("/campaigns/0/cancel").status_code == 422
    assert _jobs(coordinator, c4["id"]) == []
    worker.close()


def test_retry_dead_and_failed_jobs(coordinator: Coordinator) -> None:
    _, token = enroll(coordinator)
    worker = coordinator.client(token)
    c = create_campaign(coordinator, shapes=shapes(3), max_attempts=1)
    first, second = lease(worker), lease(worker)
    assert first is not None and second is not None
    r = worker.post(f"/jobs/{first['job_id']}/fail", json={"lease_token": first["lease_token"],
                                                             "error": "launch failed"})
    assert r.status_code == 200 and r.json()["state"] == "dead", r.text
    failed_run = make_report(kernel=second["kernel"], shape=second["shape"], dtype=second["dtype"])
    for t in failed_run["trials"]:
        t.update(status="launch_error", error="boom", samples_us=None, median_us=None, p10_us=None,
                 p90_us=None, n=0)
    failed_run["best_config_key"] = None
    r = worker.post(f"/jobs/{second['job_id']}/result",
                    json={"lease_token": second["lease_token"], "report": failed_run})
    assert r.status_code == 201, r.text

    with coordinator.admin() as admin:
        r = admin.post(f"/campaigns/{c['id']}/retry")
    assert r.status_code == 200, r.text
    assert (r.json()["requeued"], r.json()["recreated"]) == (1, 1)
    jobs = {j["id"]: j for j in _jobs(coordinator, c["id"])}
    assert jobs[first["job_id"]]["state"] == "queued" and jobs[first["job_id"]]["attempts"] == 0
    assert jobs[second["job_id"]]["state"] == "done"  # the done job keeps its result
    new = [j for j in jobs.values() if j["id"] not in (first["job_id"], second["job_id"])
           and j["shape"] == second["shape"]]
    assert len(new) == 1 and new[0]["state"] == "queued"
    assert _campaign(coordinator, c["id"]).json()["progress"]["queued"] == 3  # 1 untouched + 2 retried
    again = lease(worker)
    assert again is not None  # the requeued jobs run again

    with coordinator.admin() as admin:
        admin.post(f"/campaigns/{c['id']}/cancel")
        r = admin.post(f"/campaigns/{c['id']}/retry")
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    worker.close()


def _cli(coordinator: Coordinator, *args: str) -> Result:
    """``kernelfleet admin ARGS`` in this process (click's runner; ``exit_code`` for the status)."""
    return run_cli("admin", *args, "--coordinator", coordinator.url, "--admin-token", coordinator.admin_token)


def test_no_matching_worker_warning_and_cli(coordinator: Coordinator) -> None:
    none = create_campaign(coordinator, name="nobody")
    assert len(none["warnings"]) == 1 and "no worker is enrolled yet" in none["warnings"][0]
    enroll(coordinator)  # a cuda H100
    assert create_campaign(coordinator, name="any")["warnings"] == []
    assert create_campaign(coordinator, name="h100", target_backend="cuda", target_chip="nvidia h100*")[
        "warnings"] == []
    metal = create_campaign(coordinator, name="metal", target_backend="metal")
    assert "no enrolled worker matches metal" in metal["warnings"][0] and H100 in metal["warnings"][0]
    chip = create_campaign(coordinator, name="m3", target_chip="Apple M3*")
    assert "'Apple M3*'" in chip["warnings"][0]

    # the one real `kernelfleet` process here (the installed entry point); the rest run in-process
    create = ("admin", "campaign", "create", "--name", "cli", "--kernel", "rmsnorm", "--shape", "4096x4096",
              "--dtype", "float16", "--backend", "metal", "--coordinator", coordinator.url,
              "--admin-token", coordinator.admin_token)
    made = subprocess.run(kernelfleet_cmd(*create), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert "warning:" in made.stderr and "no enrolled worker matches metal" in made.stderr
    listed = _cli(coordinator, "campaign", "list", "--json")
    assert listed.exit_code == 0, listed.stderr
    rows = json.loads(listed.stdout)
    cli_id = next(r["id"] for r in rows if r["name"] == "cli")
    cancelled = _cli(coordinator, "campaign", "cancel", str(cli_id))
    assert cancelled.exit_code == 0 and "1 queued job(s) cancelled" in cancelled.stdout, cancelled.stderr
    retried = _cli(coordinator, "campaign", "retry", str(cli_id))
    assert retried.exit_code == 1 and "is cancelled" in retried.stderr
    deleted = _cli(coordinator, "campaign", "delete", str(cli_id))
    assert deleted.exit_code == 0 and f"campaign {cli_id} deleted" in deleted.stdout, deleted.stderr
    for args in (("workers", "list"), ("jobs", "list"), ("regressions", "list"), ("webhooks", "list")):
        got = _cli(coordinator, *args, "--json")
        assert got.exit_code == 0, (args, got.stderr)
        assert isinstance(json.loads(got.stdout), list), args
    jobs = json.loads(_cli(coordinator, "jobs", "list", "--json", "--campaign", str(none["id"])).stdout)
    assert [j["campaign_id"] for j in jobs] == [none["id"]]
