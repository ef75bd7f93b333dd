"""The worker agent end to end: real ``kernelfleet worker`` processes (CPU backend, real MLX tuning)
against a real coordinator on SQLite and PostgreSQL.

Jobs are rmsnorm on small shapes with a tiny ``--budget`` so each tune takes a fraction of a
second; the "slow" jobs (a large shape with a larger budget) exist only to catch a worker mid-job.
"""

from __future__ import annotations

import http.server
import stat
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import (
    create_campaign,
    jobs,
    mint_enroll_token,
    results,
    run_worker,
    start_worker,
    stop_all,
    wait_for,
    workers,
)
from conftest import Coordinator, free_port

FAST = ("--budget", "0.02", "--poll-seconds", "0.2")
SLOW_SHAPE = "2048x4096"  # ~1.5 s at --budget 0.5, ~6 s at --budget 5 on this machine's CPU


def _all_done(coordinator: Coordinator, campaign_id: int) -> list[dict[str, Any]] | None:
    js = jobs(coordinator, campaign_id)
    return js if js and all(j["state"] == "done" for j in js) else None


def test_three_workers_run_a_campaign_exactly_once(coordinator: Coordinator, tmp_path: Path) -> None:
    procs = [
        start_worker(
            coordinator.url, tmp_path / f"w{i}", f"w{i}", *FAST, enroll_token=mint_enroll_token(coordinator)
        )
        for i in range(3)
    ]
    try:
        # all three enrolled (and so polling) before the work appears, so all can take part
        wait_for(
            "three enrolled workers",
            lambda: len(workers(coordinator)) == 3,
            timeout=60,
            diagnostics=lambda: "\n".join(p.log() for p in procs),
        )
        shapes = [f"{r}x{c}" for r in (1, 4, 8, 16, 32) for c in (64, 128)]
        campaign = create_campaign(coordinator, shapes, ["float32", "float16", "bfloat16"])
        done = wait_for(
            "every job done",
            lambda: _all_done(coordinator, campaign),
            timeout=150,
            diagnostics=lambda: "\n".join(p.log()[-2000:] for p in procs),
        )
        codes = stop_all(procs)
    finally:
        stop_all(procs)

    assert codes == {"w0": 0, "w1": 0, "w2": 0}, [p.log() for p in procs]
    assert len(done) == 30
    rows = results(coordinator)
    by_job = Counter(r["job_id"] for r in rows)
    assert sorted(by_job) == sorted(j["id"] for j in done) and set(by_job.values()) == {1}
    assert all(j["attempts"] == 1 for j in done), "no job should have been retried in a healthy run"
    ids = {name: w["id"] for name, w in workers(coordinator).items()}
    for row, job in zip(sorted(rows, key=lambda r: r["job_id"]), done, strict=True):
        assert (row["kernel"], row["shape"], row["dtype"]) == (job["kernel"], job["shape"], job["dtype"])
        assert row["worker_id"] in ids.values()
    per_worker = Counter(r["worker_id"] for r in rows)
    assert len(per_worker) >= 2, f"the campaign should be shared out, got {per_worker}"
    for p in procs:
        # the token is stored privately, the spool is empty, and each job got one human-readable line
        assert stat.S_IMODE((p.state_dir / "token").stat().st_mode) == 0o600
        assert p.pending() == [] and p.quarantined() == []
        lines = [line for line in p.log().splitlines() if " rmsnorm " in line and "best builtin" in line]
        assert len(lines) == per_worker[ids[p.name]], p.log()


def test_kill9_mid_job_is_finished_by_another_worker(coordinator_factory: Any, tmp_path: Path) -> None:
    coordinator = coordinator_factory(
        KERNELFLEET_LEASE_SECONDS="2",
        KERNELFLEET_REAPER_INTERVAL_SECONDS="0.5",
        KERNELFLEET_REQUEUE_BACKOFF_SECONDS="0.2",
    )
    campaign = create_campaign(coordinator, [SLOW_SHAPE], ["float32"])
    victim = start_worker(
        coordinator.url,
        tmp_path / "victim",
        "victim",
        "--budget",
        "5",
        "--poll-seconds",
        "0.2",
        enroll_token=mint_enroll_token(coordinator),
    )
    rescuer = None
    try:
        victim_id = wait_for(
            "the victim to enroll",
            lambda: workers(coordinator).get("victim"),
            timeout=60,
            diagnostics=victim.log,
        )["id"]
        (job,) = wait_for(
            "the victim to lease the job",
            lambda: [
                j
                for j in jobs(coordinator, campaign)
                if j["state"] == "leased" and j["leased_by"] == victim_id and j["lease_confirmed"]
            ],
            diagnostics=victim.log,
        )
        victim.kill9()
        assert jobs(coordinator, campaign)[0]["state"] != "done", "the kill must land mid-job"
        rescuer = start_worker(
            coordinator.url,
            tmp_path / "rescuer",
            "rescuer",
            "--budget",
            "0.3",
            "--poll-seconds",
            "0.2",
            enroll_token=mint_enroll_token(coordinator),
        )
        (final,) = wait_for(
            "the job to be done",
            lambda: _all_done(coordinator, campaign),
            timeout=90,
            diagnostics=lambda: rescuer.log() if rescuer else "",
        )
        assert stop_all([rescuer]) == {"rescuer": 0}
    finally:
        victim.terminate()
        if rescuer is not None:
            stop_all([rescuer])
    rescuer_id = workers(coordinator)["rescuer"]["id"]
    (row,) = results(coordinator)
    assert row["job_id"] == job["id"] and row["worker_id"] == rescuer_id
    assert final["attempts"] == 2  # the victim's lease expired and was reaped once
    assert victim.pending() == []  # it died before it had anything to send


def test_sigterm_finishes_within_grace_or_releases(coordinator_factory: Any, tmp_path: Path) -> None:
    coordinator = coordinator_factory(
        KERNELFLEET_LEASE_SECONDS="3", KERNELFLEET_REAPER_INTERVAL_SECONDS="0.5"
    )
    campaign = create_campaign(coordinator, [SLOW_SHAPE], ["float32", "float16"])
    # grace 0.5 s against a ~6 s tune: the job is given back, not counted as an attempt
    short = start_worker(
        coordinator.url,
        tmp_path / "short",
        "short",
        "--budget",
        "5",
        "--grace-seconds",
        "0.5",
        "--poll-seconds",
        "0.2",
        enroll_token=mint_enroll_token(coordinator),
    )
    short_id = wait_for("enrolled", lambda: workers(coordinator).get("short"), diagnostics=short.log)["id"]
    (leased,) = wait_for(
        "a lease",
        lambda: [
            j for j in jobs(coordinator, campaign) if j["state"] == "leased" and j["leased_by"] == short_id
        ],
        diagnostics=short.log,
    )
    short.terminate()
    assert short.wait(30) == 0, short.log()
    after = {j["id"]: j for j in jobs(coordinator, campaign)}[leased["id"]]
    assert after["state"] == "queued" and after["attempts"] == 0 and after["leased_by"] is None
    assert "released" in short.log()

    # a generous grace: the current job is finished and reported, then the worker exits 0
    patient = start_worker(
        coordinator.url,
        tmp_path / "patient",
        "patient",
        "--budget",
        "0.5",
        "--grace-seconds",
        "60",
        "--poll-seconds",
        "0.2",
        enroll_token=mint_enroll_token(coordinator),
    )
    patient_id = wait_for("enrolled", lambda: workers(coordinator).get("patient"), diagnostics=patient.log)[
        "id"
    ]
    (leased,) = wait_for(
        "a lease",
        lambda: [
            j for j in jobs(coordinator, campaign) if j["state"] == "leased" and j["leased_by"] == patient_id
        ],
        diagnostics=patient.log,
    )
    patient.terminate()
    assert patient.wait(60) == 0, patient.log()
    states = {j["id"]: j["state"] for j in jobs(coordinator, campaign)}
    assert states[leased["id"]] == "done"
    assert list(states.values()).count("done") == 1, "after SIGTERM it must lease nothing new"
    assert [r["job_id"] for r in results(coordinator)] == [leased["id"]]


def test_sigterm_while_idle_in_a_lease_poll_stops_at_once(coordinator_factory: Any, tmp_path: Path) -> None:
    """An idle worker waits on a long-polled lease (here up to 300 s); SIGTERM gives that poll up
    instead of waiting for its answer: it exits 0 well before the poll would end (the 120 s bound is
    a stall detector), having leased nothing."""
    coordinator = coordinator_factory(KERNELFLEET_LEASE_WAIT_MAX_SECONDS="300")
    idle = start_worker(coordinator.url, tmp_path / "idle", "idle", "--lease-wait", "300",
                        enroll_token=mint_enroll_token(coordinator))
    wait_for("enrolled", lambda: workers(coordinator).get("idle"), diagnostics=idle.log)
    time.sleep(1.0)  # its first lease poll follows enrollment at once (a signal before it stops it too)
    idle.terminate()
    assert idle.wait(120) == 0, idle.log()
    assert "worker stopped after 0 jobs" in idle.log() and "Traceback" not in idle.log(), idle.log()
    create_campaign(coordinator, ["4x64"], ["float32"])  # nothing was leased: the job stays queued
    assert [j["state"] for j in jobs(coordinator)] == ["queued"]


def test_revoked_worker_stops_mid_job_and_says_so(coordinator_factory: Any, tmp_path: Path) -> None:
    coordinator = coordinator_factory(KERNELFLEET_LEASE_SECONDS="1.5")
    campaign = create_campaign(coordinator, [SLOW_SHAPE], ["float32"])
    w = start_worker(
        coordinator.url,
        tmp_path / "w",
        "doomed",
        "--budget",
        "5",
        "--poll-seconds",
        "0.2",
        enroll_token=mint_enroll_token(coordinator),
    )
    try:
        wid = wait_for("enrolled", lambda: workers(coordinator).get("doomed"), diagnostics=w.log)["id"]
        wait_for(
            "a lease",
            lambda: [j for j in jobs(coordinator, campaign) if j["leased_by"] == wid],
            diagnostics=w.log,
        )
        with coordinator.admin() as admin:
            assert admin.post(f"/workers/{wid}/revoke").status_code == 200
        code = w.wait(30)
    finally:
        w.terminate()
    out = w.log()
    assert code == 4, out
    assert "revoked" in out and "Traceback" not in out
    assert results(coordinator) == [] and w.pending() == []
    # and it cannot come back with its old token
    code, out = run_worker(coordinator.url, tmp_path / "w", "doomed", *FAST)
    assert code == 4 and "refused this worker's stored token" in out and "Traceback" not in out


def test_torn_spool_record_is_quarantined_and_the_rest_replayed(
    coordinator_factory: Any, tmp_path: Path
) -> None:
    """Replay at start: good records are delivered; a torn record, a stale lease (409) and a refused
    report (422) go to quarantine with their reasons, and the two refused jobs are run again."""
    from kernelfleet.worker.client import CoordinatorClient
    from kernelfleet.worker.spool import Spool
    from kernelfleet.worker.tuner import tune

    coordinator = coordinator_factory(KERNELFLEET_REQUEUE_BACKOFF_SECONDS="0.2")
    state_dir = tmp_path / "w"
    # first run: enroll, then stop it while idle (SIGTERM -> exit 0)
    w = start_worker(
        coordinator.url, state_dir, "replayer", *FAST, enroll_token=mint_enroll_token(coordinator)
    )
    wait_for("enrolled", lambda: workers(coordinator).get("replayer"), diagnostics=w.log)
    assert stop_all([w]) == {"replayer": 0}
    token = (state_dir / "token").read_text().strip()

    # what a worker leaves behind when it dies after spooling, before sending: real leases and real
    # tuning reports, written by the agent's own spool code ... and one record torn mid-write
    campaign = create_campaign(coordinator, ["4x64", "8x64", "16x64", "32x64", "64x64"], ["float32"])
    spool = Spool(state_dir / "spool")
    with CoordinatorClient(coordinator.url, token) as client:
        leases = [client.lease() for _ in range(5)]
        reports = [tune(x.kernel, x.shape, x.dtype, budget=0.02) for x in leases if x is not None]
        assert len(reports) == 5
        good, stale, refused = leases[:3], leases[3], leases[4]
        assert stale is not None and refused is not None
        for lease, report in zip(good, reports, strict=False):
            assert lease is not None
            spool.put("result", lease.job_id, lease.lease_token, {"report": report})
        client.release(stale.job_id, stale.lease_token)  # its lease is gone: the coordinator answers 409
        spool.put("result", stale.job_id, stale.lease_token, {"report": reports[3]})
        # a report for another shape than the job's: the coordinator answers 422
        spool.put("result", refused.job_id, refused.lease_token, {"report": reports[0]})
    torn_name = "00000000000000000000-job999-result.json"
    record = spool.replay()[0].path.read_bytes()
    (spool.pending_dir / torn_name).write_bytes(record[: len(record) // 3])

    # second run, without --enroll-token: the stored token is reused and the spool replayed
    w = start_worker(coordinator.url, state_dir, "replayer", *FAST)
    try:
        done = wait_for(
            "every job done", lambda: _all_done(coordinator, campaign), timeout=60, diagnostics=w.log
        )
        # a second agent on the same state directory is turned away while this one runs
        code, out = run_worker(coordinator.url, state_dir, "replayer", *FAST)
        assert code == 1 and "is already using" in out, out
    finally:
        assert stop_all([w]) == {"replayer": 0}, w.log()
    assert len(done) == 5
    assert sorted(r["job_id"] for r in results(coordinator)) == sorted(j["id"] for j in done)
    attempts = {j["id"]: j["attempts"] for j in done}
    assert [attempts[x.job_id] for x in good if x is not None] == [1, 1, 1]  # delivered from the spool
    assert attempts[stale.job_id] == 1  # released (not counted), then leased and run again
    assert attempts[refused.job_id] == 2  # the refusal was reported as a failed attempt, then re-run
    assert w.pending() == []
    reasons = {p.name: (p.parent / f"{p.name}.reason.txt").read_text() for p in w.quarantined()}
    assert len(reasons) == 3
    assert "invalid JSON" in reasons[torn_name]
    (stale_reason,) = [r for n, r in reasons.items() if f"-job{stale.job_id}-" in n]
    (refused_reason,) = [r for n, r in reasons.items() if f"-job{refused.job_id}-" in n]
    assert "(409)" in stale_reason and "(422)" in refused_reason
    assert len(workers(coordinator)) == 1  # no second enrollment


class _NotKernelFleet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"<html><body>router admin page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_a_coordinator() -> Any:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotKernelFleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_error_exits_are_clear(coordinator: Coordinator, tmp_path: Path, not_a_coordinator: str) -> None:
    cases: list[tuple[str, tuple[int, str]]] = []
    # nothing listens there
    cases.append(
        (
            "cannot reach",
            run_worker(f"http://127.0.0.1:{free_port()}", tmp_path / "a", "a", enroll_token="kfe_x"),
        )
    )
    # something else listens there
    cases.append(
        (
            "not a KernelFleet coordinator",
            run_worker(not_a_coordinator, tmp_path / "b", "b", enroll_token="kfe_x"),
        )
    )
    # a made-up, an expired, and an already used enrollment token
    cases.append(
        (
            "enrollment token was refused",
            run_worker(coordinator.url, tmp_path / "c", "c", enroll_token="kfe_made-up"),
        )
    )
    expired = mint_enroll_token(coordinator, ttl_seconds=0.001)
    cases.append(("expired", run_worker(coordinator.url, tmp_path / "d", "d", enroll_token=expired)))
    # no token at all on a first run
    cases.append(("not enrolled yet", run_worker(coordinator.url, tmp_path / "e", "e")))

    expected_codes = [3, 3, 4, 4, 3]
    for (needle, (code, out)), want in zip(cases, expected_codes, strict=True):
        assert code == want, out
        assert needle in out, out
        assert "Traceback" not in out
    assert workers(coordinator) == {}
    # a refused enrollment stores nothing
    assert not (tmp_path / "c" / "token").exists()


def test_serve_local_worker_enrolls_once_and_reuses_its_token(tmp_path: Path) -> None:
    """`make run`: `kernelfleet serve --local-worker` starts this agent next to the coordinator."""
    import os
    import signal
    import subprocess

    from conftest import kernelfleet_cmd

    db_url = f"sqlite:///{tmp_path / 'kf.db'}"
    env = dict(
        os.environ,
        KERNELFLEET_DATABASE_URL=db_url,
        KERNELFLEET_ADMIN_TOKEN="adm-local-test",
        PYTHONUNBUFFERED="1",
    )
    subprocess.run(kernelfleet_cmd("db", "upgrade"), env=env, check=True, capture_output=True)
    local = Coordinator(db_url=db_url, workdir=tmp_path, admin_token="adm-local-test")

    def serve() -> subprocess.Popen[bytes]:
        log = open(tmp_path / "serve.log", "ab")  # noqa: SIM115 - lives as long as the process
        return subprocess.Popen(
            kernelfleet_cmd("serve", "--port", str(local.port), "--local-worker"),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGINT)  # Ctrl-C in `make run`
        proc.wait(timeout=60)

    def healthy() -> bool:
        try:
            return httpx.get(local.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    server = serve()
    try:
        wait_for(
            "the coordinator", healthy, timeout=60, diagnostics=lambda: (tmp_path / "serve.log").read_text()
        )
        wait_for(
            "the local worker",
            lambda: len(workers(local)) == 1,
            timeout=90,
            diagnostics=lambda: (tmp_path / "serve.log").read_text(),
        )
        campaign = create_campaign(local, ["4x64"], ["float32"])  # one job: the tuning is not under test
        wait_for(
            "every job done",
            lambda: _all_done(local, campaign),
            timeout=90,
            diagnostics=lambda: (tmp_path / "serve.log").read_text(),
        )
    finally:
        stop(server)
    token = tmp_path / "local-worker" / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    first_token = token.read_text()

    server = serve()  # again: the stored token is reused, no second enrollment
    try:
        wait_for(
            "the coordinator", healthy, timeout=60, diagnostics=lambda: (tmp_path / "serve.log").read_text()
        )
        campaign = create_campaign(local, ["16x64"], ["float32"])
        wait_for(
            "the new job done",
            lambda: _all_done(local, campaign),
            timeout=90,
            diagnostics=lambda: (tmp_path / "serve.log").read_text(),
        )
        enrolled = workers(local)
    finally:
        stop(server)
    log = (tmp_path / "serve.log").read_text()
    assert len(enrolled) == 1 and token.read_text() == first_token
    assert "using the stored worker token" in log and "Traceback" not in log
    assert len(results(local)) == 2


def test_the_agent_beats_when_the_coordinator_says() -> None:
    """The heartbeat answer's next_heartbeat_seconds sets the next beat, kept within 0.2 s and a third
    of the lease; a coordinator that does not say (older) leaves the third of the lease."""
    from kernelfleet.worker.agent import next_interval

    assert next_interval({"lease_expires_at": "x", "next_heartbeat_seconds": 27.5}, 40.0) == 27.5
    assert next_interval({"next_heartbeat_seconds": 400}, 40.0) == 40.0  # never past a third of the lease
    assert next_interval({"next_heartbeat_seconds": 0}, 40.0) == 0.2
    for older in ({"lease_expires_at": "x"}, {"next_heartbeat_seconds": None},
                  {"next_heartbeat_seconds": "soon"}, {"next_heartbeat_seconds": True}, None):
        assert next_interval(older, 40.0) == 40.0
