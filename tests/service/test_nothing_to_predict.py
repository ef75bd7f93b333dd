"""`kernelfleet pull --allow-predicted` with nothing to predict from fails at once, naming what is
missing, and queues no build (issue 29, item 4: it used to wait 60 s, say "still building", and the
background loop rebuilt an empty profile over and over). In-thread coordinator."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from coordinator_helpers import make_report
from inproc import fast_settings, run_cli, serve_in_thread
from sqlalchemy import func, select

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import ProfileBuild, ProfileRequest

ADMIN = "kfa_test-admin"


@pytest.fixture
def served(migrated_db_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path / "profiles"))
    with serve_in_thread(fast_settings(migrated_db_url)) as (url, _):
        yield url


def queued_and_built(db_url: str) -> tuple[int, int]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return (
                conn.scalar(select(func.count()).select_from(ProfileRequest)) or 0,
                conn.scalar(select(func.count()).select_from(ProfileBuild)) or 0,
            )
    finally:
        engine.dispose()


def pull(url: str, chip: str, *more: str) -> tuple[int, str, float]:
    started = time.monotonic()
    r = run_cli(
        "pull",
        "--coordinator",
        url,
        "--chip",
        chip,
        "--allow-predicted",
        "--no-zmlx",
        *more,
        env={"KERNELFLEET_TOKEN": ADMIN},
    )
    return r.exit_code, " ".join(r.output.split()), time.monotonic() - started


def test_pull_allow_predicted_with_nothing_to_predict_from_fails_at_once(
    served: str, migrated_db_url: str
) -> None:
    code, said, took = pull(served, "Apple M3 Max")
    assert code == 1 and took < 10, (took, said)
    assert "no metal chip has results: run a campaign on a Mac" in said, said
    assert "still building" not in said
    assert queued_and_built(migrated_db_url) == (0, 0)  # nothing queued, so nothing is rebuilt

    # NVIDIA results predict other NVIDIA chips, never a Mac
    with httpx.Client(base_url=served + "/api/v1", headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        assert admin.post("/results/import", json={"reports": [make_report()]}).status_code == 201
    code, said, _ = pull(served, "Apple M3 Max")
    assert code == 1 and "no metal chip has results: run a campaign on a Mac" in said, said
    # a per-version profile comes from the chip's own results only
    code, said, _ = pull(served, "NVIDIA H200", "--mlx-version", "0.32.4")
    assert code == 1 and "has no results with MLX 0.32.4" in said and "drop --mlx-version" in said, said
    code, said, took = pull(served, "NVIDIA H200")  # the H100's results: a predicted-only profile
    assert code == 0 and "profile for NVIDIA H200 version 1 installed" in said and took < 30, said
    queued, _ = queued_and_built(migrated_db_url)
    assert queued == 0
