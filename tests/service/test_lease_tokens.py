"""Lease tokens are stored only as SHA-256 digests, and a lease belongs to the worker that holds it:
another worker gets 409 with the right token and payload, on completion, on its replay and on
heartbeats."""

from __future__ import annotations

import hashlib

from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease
from sqlalchemy import select

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Job, Result


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_lease_tokens_are_hashed_at_rest(coordinator: Coordinator) -> None:
    create_campaign(coordinator, shapes=["1x4096", "2x4096"])
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        held, done = lease(c), lease(c)
        assert held is not None and done is not None
        assert complete(c, done).status_code == 201
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            stored = {job_id: token for job_id, token in conn.execute(select(Job.id, Job.lease_token))}
            result_token = conn.scalar(select(Result.lease_token).where(Result.job_id == done["job_id"]))
    finally:
        engine.dispose()
    assert stored[held["job_id"]] == sha256(held["lease_token"])
    assert stored[done["job_id"]] == result_token == sha256(done["lease_token"])
    clear = {held["lease_token"], done["lease_token"]}
    assert not clear & {*stored.values(), result_token}


def test_another_worker_cannot_complete_or_replay_a_lease(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, owner_token = enroll(coordinator, "owner")
    _, thief_token = enroll(coordinator, "thief")
    with coordinator.client(owner_token) as owner, coordinator.client(thief_token) as thief:
        got = lease(owner)
        assert got is not None
        hb = thief.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
        assert hb.status_code == 409, hb.text
        stolen = complete(thief, got)  # right token, right payload, wrong worker
        assert stolen.status_code == 409, stolen.text
        first = complete(owner, got)
        assert first.status_code == 201, first.text
        replay = complete(thief, got)  # the same payload again, by the other worker
        assert replay.status_code == 409, replay.text
        assert "result_id" not in replay.json()
        assert complete(owner, got).status_code == 200  # the owner's own replay still gets its answer
