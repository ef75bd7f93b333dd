"""Leasing against a real coordinator: exactly-once under concurrency, matching, heartbeats."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease, shapes
from sqlalchemy import func, select

from kernelfleet.service.auth import digest
from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Job, JobState, Result, Trial


def test_sixteen_concurrent_workers_complete_200_jobs_exactly_once(coordinator: Coordinator) -> None:
    campaign = create_campaign(coordinator, kernels=["rmsnorm", "softmax"], shapes=shapes(50),
                               dtypes=["float16", "bfloat16"])
    assert campaign["progress"] == {"total": 200, "queued": 200, "leased": 0, "done": 0, "dead": 0,
                                    "cancelled": 0}
    workers = [enroll(coordinator, name=f"w{i}") for i in range(16)]

    leases: list[tuple[int, int, str]] = []  # (worker_id, job_id, lease_token)
    completions: list[tuple[int, int, int]] = []  # (worker_id, job_id, status)
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(workers))

    def run(worker_id: int, token: str) -> None:
        try:
            with coordinator.client(token) as client:
                start.wait()
                while (got := lease(client)) is not None:
                    with lock:
                        leases.append((worker_id, got["job_id"], got["lease_token"]))
                    r = complete(client, got, chip="NVIDIA H100 80GB HBM3")
                    with lock:
                        completions.append((worker_id, got["job_id"], r.status_code))
                    if r.status_code != 201:
                        errors.append(f"job {got['job_id']}: {r.status_code} {r.text}")
        except Exception as e:  # surfaced through `errors`
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=w) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors[:5]

    leased_jobs = Counter(job_id for _, job_id, _ in leases)
    assert len(leased_jobs) == 200
    assert max(leased_jobs.values()) == 1, "a job was leased twice"
    assert len({tok for _, _, tok in leases}) == 200, "lease tokens must be unique"
    assert sorted(job for _, job, status in completions if status == 201) == sorted(leased_jobs)
    assert len({w for w, _, _ in leases}) > 1, "work should spread over several workers"

    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            states = dict(conn.execute(select(Job.state, func.count()).group_by(Job.state)).all())
            assert states == {JobState.done.value: 200} or states == {JobState.done: 200}
            assert conn.scalar(select(func.count()).select_from(Result)) == 200
            assert conn.scalar(select(func.count(func.distinct(Result.job_id)))) == 200
            assert conn.scalar(select(func.count()).select_from(Trial)) == 600
            # every result belongs to the worker that held the job's lease, under that lease's token
            mismatched = conn.scalar(
                select(func.count()).select_from(Result).join(Job, Job.id == Result.job_id)
                .where((Result.worker_id != Job.leased_by) | (Result.lease_token != Job.lease_token)))
            assert mismatched == 0
            by_lease = {(w, j, digest(t)) for w, j, t in leases}  # tokens are stored as digests
            stored = {(r.worker_id, r.job_id, r.lease_token)
                      for r in conn.execute(select(Result.worker_id, Result.job_id, Result.lease_token))}
            assert stored == by_lease
    finally:
        engine.dispose()

    with coordinator.admin() as admin:
        progress = admin.get(f"/campaigns/{campaign['id']}").json()["progress"]
    assert progress == {"total": 200, "queued": 0, "leased": 0, "done": 200, "dead": 0, "cancelled": 0}


def test_jobs_go_only_to_matching_backend_and_chip(coordinator: Coordinator) -> None:
    create_campaign(coordinator, name="m3 only", target_backend="metal", target_chip="Apple M3*",
                    shapes=["1x64"])
    create_campaign(coordinator, name="cuda only", target_backend="cuda", shapes=["2x64"])
    create_campaign(coordinator, name="anyone", shapes=["3x64"])
    _, cpu = enroll(coordinator, "cpu box", chip="Intel Xeon", backend="cpu")
    _, m2 = enroll(coordinator, "m2", chip="Apple M2 Pro", backend="metal")
    _, m3 = enroll(coordinator, "m3", chip="Apple M3 Max", backend="metal")
    _, h100 = enroll(coordinator, "h100", chip="NVIDIA H100 80GB HBM3", backend="cuda")

    def take_all(token: str) -> list[str]:
        got: list[dict[str, Any]] = []
        with coordinator.client(token) as c:
            while (x := lease(c)) is not None:
                got.append(x)
        return [g["shape"] for g in got]

    assert take_all(cpu) == ["3x64"]  # only the untargeted job
    assert take_all(m2) == []  # wrong chip for the M3 campaign, wrong backend for CUDA
    assert take_all(h100) == ["2x64"]
    assert take_all(m3) == ["1x64"]


def test_a_target_added_after_the_targets_were_read_is_leased_from(coordinator: Coordinator) -> None:
    """A process reads the job targets again only when their number changed (targets.runnable_targets):
    a campaign for a new target, created after this worker's leases matched it against the old ones,
    is leased from at once, and so is a campaign of a target the process has read before."""
    create_campaign(coordinator, name="anyone", shapes=["1x64"])
    _, m3 = enroll(coordinator, "m3", chip="Apple M3 Max", backend="metal")
    with coordinator.client(m3) as c:
        got = lease(c)
        assert got is not None and got["shape"] == "1x64"
        assert lease(c) is None  # the targets read and matched: nothing left for this worker
        create_campaign(coordinator, name="m3 only", target_backend="metal", target_chip="Apple M3*",
                        shapes=["2x64"])
        got = lease(c)
        assert got is not None and got["shape"] == "2x64"
        assert lease(c) is None
        create_campaign(coordinator, name="m3 again", target_backend="metal", target_chip="Apple M3*",
                        shapes=["3x64"])
        got = lease(c)
        assert got is not None and got["shape"] == "3x64"
        create_campaign(coordinator, name="cuda only", target_backend="cuda", shapes=["4x64"])
        assert lease(c) is None  # a new target, not this worker's


def test_heartbeat_extends_only_the_current_lease(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    _, other = enroll(coordinator, "other")
    with coordinator.client(token) as c, coordinator.client(other) as o:
        got = lease(c)
        assert got is not None
        r = c.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
        assert r.status_code == 200, r.text
        assert r.json()["lease_expires_at"] >= got["lease_expires_at"]
        # each answer says when to beat next: within a third of the lease, spread (drawn per beat)
        third = got["lease_seconds"] / 3
        nexts = [c.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
                 .json()["next_heartbeat_seconds"] for _ in range(24)]
        assert all(0.6 * third <= n <= third for n in nexts), nexts
        assert len(set(nexts)) >= 12 and max(nexts) - min(nexts) >= 0.1 * third, nexts
        r = c.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": "kfl_not-the-token"})
        assert r.status_code == 409 and "no longer valid" in r.json()["detail"]
        r = o.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
        assert r.status_code == 409, "another worker cannot extend this lease"
        assert lease(o) is None


def test_release_gives_the_job_back_without_counting_an_attempt(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        r = c.post(f"/jobs/{got['job_id']}/release", json={"lease_token": got["lease_token"]})
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "queued" and r.json()["attempts"] == 0
        again = lease(c)
        assert again is not None and again["job_id"] == got["job_id"]
        assert again["lease_token"] != got["lease_token"]
        assert complete(c, again).status_code == 201


def test_worker_calls_record_last_heartbeat(coordinator: Coordinator) -> None:
    worker_id, token = enroll(coordinator)
    with coordinator.admin() as admin:
        before = next(w for w in admin.get("/workers").json() if w["id"] == worker_id)["last_heartbeat_at"]
    with coordinator.client(token) as c:
        me = c.get("/workers/me")
        assert me.status_code == 200 and me.json()["id"] == worker_id
        assert me.json()["chip"] == "NVIDIA H100 80GB HBM3" and me.json()["gpu_cores"] == 132
        assert me.json()["last_heartbeat_at"] >= before
