"""The fleet page at 10,000 workers: its per-status counts cover the whole fleet (SQL aggregates,
not the rows shown), and the table is paged."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
from conftest import Coordinator
from sqlalchemy import insert

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Backend, Worker
from kernelfleet.web.fleet import PAGE_SIZE

ONLINE, OFFLINE, REVOKED = 6_000, 3_500, 500


def fill(db_url: str) -> None:
    now = datetime.now(UTC)
    rows = []
    for i in range(ONLINE + OFFLINE + REVOKED):
        seen = now if i < ONLINE else now - timedelta(days=1)
        rows.append({"name": f"mac-{i:05d}", "token_digest": f"{i:064x}", "chip": f"Apple M{1 + i % 4} Max",
                     "backend": Backend.metal, "os": "macOS 15", "mlx_version": "0.32.4",
                     "last_heartbeat_at": seen,
                     "revoked_at": now if i >= ONLINE + OFFLINE else None})
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(Worker), rows)
    finally:
        engine.dispose()


def tiles(html: str) -> dict[str, int]:
    found = re.findall(r"<b>(\d+)</b><span>(online|offline|revoked)</span>", html)
    return {name: int(n) for n, name in found}


def test_fleet_page_counts_and_pages_ten_thousand_workers(coordinator: Coordinator) -> None:
    fill(coordinator.db_url)
    with httpx.Client(base_url=coordinator.url, timeout=60.0) as c:
        first = c.get("/")
        assert first.status_code == 200
        assert tiles(first.text) == {"online": ONLINE, "offline": OFFLINE, "revoked": REVOKED}
        assert first.text.count("<tr data-worker=") == PAGE_SIZE
        assert f"1–{PAGE_SIZE} of {ONLINE + OFFLINE + REVOKED}" in first.text

        last = c.get("/", params={"status": "revoked", "offset": REVOKED - 10})
        assert last.text.count("<tr data-worker=") == 10
        assert last.text.count('class="status revoked"') == 10
        assert tiles(last.text) == {"online": ONLINE, "offline": OFFLINE, "revoked": REVOKED}

        one_chip = c.get("/", params={"chip": "Apple M1 Max", "status": "online"})
        counts = tiles(one_chip.text)
        assert counts == {"online": ONLINE // 4, "offline": OFFLINE // 4, "revoked": REVOKED // 4}
        assert one_chip.text.count('class="status online"') == PAGE_SIZE
