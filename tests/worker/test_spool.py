"""The worker's durable spool and state directory, on a real filesystem."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest

from kernelfleet.worker.backoff import Backoff
from kernelfleet.worker.spool import Spool
from kernelfleet.worker.state import Credentials, StateError, WorkerState

REPORT = {"kernel": "rmsnorm", "shape": "8x64", "dtype": "float32", "trials": [{"median_us": 1.5}]}


def test_put_is_complete_private_and_replayable(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    rec = spool.put("result", 7, "lease-abc", {"report": REPORT})
    assert rec.path.parent == spool.pending_dir and rec.path.exists()
    assert stat.S_IMODE(rec.path.stat().st_mode) == 0o600
    assert not [p for p in spool.pending_dir.iterdir() if p.name.endswith(".tmp")]
    on_disk = json.loads(rec.path.read_text())
    assert on_disk["job_id"] == 7 and on_disk["lease_token"] == "lease-abc"
    assert on_disk["body"]["report"] == REPORT
    assert rec.request_body() == {"lease_token": "lease-abc", "report": REPORT}
    # a second process (a restarted worker) sees the same record
    (again,) = Spool(tmp_path).replay()
    assert (again.action, again.job_id, again.lease_token) == ("result", 7, "lease-abc")
    assert again.body == {"report": REPORT}
    assert len(spool) == 1
    spool.ack(again)
    assert len(spool) == 0 and not rec.path.exists()


def test_replay_keeps_write_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    ids = [3, 1, 2, 10]
    for job_id in ids:
        spool.put("fail" if job_id == 2 else "result", job_id, f"t{job_id}", {"error": "x"})
    assert [r.job_id for r in spool.replay()] == ids


def test_torn_record_is_quarantined_and_the_rest_replayed(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    good = [spool.put("result", i, f"t{i}", {"report": REPORT}) for i in range(3)]
    torn_src = good[1].path.read_bytes()
    torn = spool.pending_dir / "00000000000000000001-job99-result.json"
    torn.write_bytes(torn_src[: len(torn_src) // 2])          # a truncated write
    leftover = spool.pending_dir / ".00000000000000000002-job98-result.json.tmp"
    leftover.write_bytes(b'{"version": 1, "act')              # crash before rename
    wrong = spool.pending_dir / "00000000000000000003-job97-result.json"
    wrong.write_text(json.dumps({"action": "result", "job_id": 97}))   # valid JSON, not a record

    replayed = spool.replay()
    assert [r.job_id for r in replayed] == [0, 1, 2]
    assert not torn.exists() and not leftover.exists() and not wrong.exists()
    quarantined = dict((p.name, reason) for p, reason in spool.quarantined())
    assert set(quarantined) == {torn.name, leftover.name.lstrip("."), wrong.name}
    assert "invalid JSON" in quarantined[torn.name]
    assert "incomplete write" in quarantined[leftover.name.lstrip(".")]
    assert "missing lease_token, body" in quarantined[wrong.name]
    # the quarantined bytes are kept for a person to inspect
    assert (spool.quarantine_dir / torn.name).read_bytes() == torn_src[: len(torn_src) // 2]
    assert len(spool) == 3


def test_quarantine_keeps_both_records_with_the_same_name(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = spool.put("result", 1, "t", {"report": REPORT})
    spool.quarantine(first.path, "409: stale lease")
    second = spool.pending_dir / first.name
    second.write_text("{")
    spool.quarantine(second, "torn")
    reasons = sorted(reason.split(" ", 1)[1] for _, reason in spool.quarantined())
    assert reasons == ["409: stale lease", "torn"]


def test_non_finite_numbers_are_refused_before_they_reach_disk(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with pytest.raises(ValueError):
        spool.put("result", 1, "t", {"report": {"median_us": math.nan}})
    assert len(spool) == 0 and not list(spool.pending_dir.iterdir())


def test_state_token_is_0600_and_reused(tmp_path: Path) -> None:
    state = WorkerState(tmp_path / "w")
    assert state.load_credentials() is None
    state.save_credentials(Credentials(token="wkr-secret", worker_id=5, coordinator="http://x"))
    assert stat.S_IMODE(state.token_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.root.stat().st_mode) == 0o700
    creds = WorkerState(tmp_path / "w").load_credentials()
    assert creds == Credentials(token="wkr-secret", worker_id=5, coordinator="http://x")


def test_state_tightens_a_loose_token_file_and_rejects_an_empty_one(tmp_path: Path) -> None:
    state = WorkerState(tmp_path)
    state.token_path.write_text("wkr-x\n")
    os.chmod(state.token_path, 0o644)
    assert state.load_credentials() == Credentials(token="wkr-x")
    assert stat.S_IMODE(state.token_path.stat().st_mode) == 0o600
    state.token_path.write_text("\n")
    with pytest.raises(StateError, match="empty"):
        state.load_credentials()


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    b = Backoff(base=0.5, cap=4.0, jitter=0.5)
    delays = [b.next_delay() for _ in range(10)]
    ceilings = [min(4.0, 0.5 * 2**i) for i in range(10)]
    assert all(c * 0.5 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays) <= 4.0 and len(set(delays)) == len(delays)  # jittered: no two alike
    b.reset()
    assert b.next_delay() <= 0.5
    with pytest.raises(ValueError):
        Backoff(base=2.0, cap=1.0)


def test_one_agent_per_state_dir(tmp_path: Path) -> None:
    first = WorkerState(tmp_path)
    first.lock()
    with pytest.raises(StateError, match=f"pid {os.getpid()}.*already using"):
        WorkerState(tmp_path).lock()
