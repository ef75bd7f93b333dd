"""Completion semantics: replay, conflicting payload, stale lease, revoked worker, import."""

from __future__ import annotations

from typing import Any

from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease, make_report
from sqlalchemy import func, select

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Result, Trial


def count_results(coordinator: Coordinator) -> tuple[int, int]:
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            return (int(conn.scalar(select(func.count()).select_from(Result)) or 0),
                    int(conn.scalar(select(func.count()).select_from(Trial)) or 0))
    finally:
        engine.dispose()


def test_duplicate_completion_returns_the_original_response(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        first = complete(c, got)
        assert first.status_code == 201, first.text
        replay = complete(c, got)
        assert replay.status_code == 200
        expected = {"result_id": first.json()["result_id"], "job_id": got["job_id"], "state": "done"}
        assert replay.json() == first.json() == expected
        different = complete(c, got, median=99.0)
        assert different.status_code == 422 and "different result" in different.json()["detail"]
    assert count_results(coordinator) == (1, 3)


def test_result_keeps_trials_env_and_golden(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        assert complete(c, got).status_code == 201
    sent = make_report()
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            r = conn.execute(select(Result)).one()
            assert (r.chip, r.backend, r.mlx_version, r.os, r.driver) == (
                "NVIDIA H100 80GB HBM3", "cuda", "0.32.4", "Linux 6.1", "580.65")
            assert r.kernel_hash == sent["env"]["kernel_hash"]
            assert r.golden == {**sent["golden"], "seed": sent["seed"]}
            assert r.best_config_key == "tg=256,vec=4" and r.best_median_us == 10.0
            assert r.builtin_median_us == 12.0 and r.best_is_builtin is False and r.source == "lease"
            trials = {t.config_key: t for t in conn.execute(select(Trial).order_by(Trial.id))}
            assert trials["tg=256,vec=4"].samples_us == sent["trials"][1]["samples_us"]
            assert trials["tg=256,vec=4"].config == {"tg": 256, "vec": 4}
            failed = trials["tg=1024,vec=8"]
            assert failed.status == "compile_error" and failed.error == "too many threads"
            assert failed.median_us is None and failed.n == 0
    finally:
        engine.dispose()


def test_stale_lease_gets_409_and_revoked_worker_401(coordinator: Coordinator) -> None:
    create_campaign(coordinator, shapes=["1x64", "2x64"])
    worker_id, token = enroll(coordinator)
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        r = c.post(f"/jobs/{got['job_id']}/result",
                   json={"lease_token": "kfl_stale", "report": make_report(shape=got["shape"])})
        assert r.status_code == 409 and "no longer valid" in r.json()["detail"]
        with coordinator.admin() as admin:
            revoked = admin.post(f"/workers/{worker_id}/revoke")
            assert revoked.status_code == 200 and revoked.json()["revoked_at"]
        calls = (lambda: c.post("/leases", json={}), lambda: complete(c, got), lambda: c.get("/workers/me"))
        for call in calls:
            r = call()
            assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert count_results(coordinator) == (0, 0)


def test_report_for_another_job_is_refused(coordinator: Coordinator) -> None:
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        r = c.post(f"/jobs/{got['job_id']}/result",
                   json={"lease_token": got["lease_token"], "report": make_report(kernel="softmax")})
        assert r.status_code == 422 and "softmax" in r.json()["detail"]
        assert complete(c, got).status_code == 201


def test_import_stores_all_or_nothing(coordinator: Coordinator) -> None:
    good = [make_report(shape=f"{i}x4096", chip="Apple M3 Max", backend="metal") for i in (1, 2, 3)]
    bad = make_report()
    bad["trials"][0]["median_us"] = -1.0
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [*good, bad]})
        assert r.status_code == 422 and "reports.3.trials.0.median_us" in r.json()["detail"]
        assert count_results(coordinator) == (0, 0)
        r = admin.post("/results/import", json={"reports": good})
        assert r.status_code == 201, r.text
        assert r.json()["imported"] == 3 and len(r.json()["result_ids"]) == 3
    assert count_results(coordinator) == (3, 9)


def test_result_hooks_run_after_commit_and_failures_do_not_fail_requests() -> None:
    from kernelfleet.service import hooks

    seen: list[int] = []

    def good(_factory: Any, result_id: int, _settings: Any) -> None:
        seen.append(result_id)

    def broken(_factory: Any, _result_id: int, _settings: Any) -> None:
        raise RuntimeError("hook bug")

    hooks.on_result_stored(broken)
    hooks.on_result_stored(good)
    hooks.on_result_stored(good)  # registering twice is a no-op
    try:
        hooks.run_result_hooks(None, 7, None)  # type: ignore[arg-type]
    finally:
        hooks._hooks.remove(broken)
        hooks._hooks.remove(good)
    assert seen == [7]
