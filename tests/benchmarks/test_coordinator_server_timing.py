"""benchmarks/coordinator_load.py's coordinator's-own-timing line: the request-duration histogram scraped
from /metrics at the window's start, middle and end, each route's p99 as the smallest bucket bound that
holds 99 % of the requests between two scrapes."""

from __future__ import annotations

import math

from . import load

load_bench = load("coordinator_load")
HEARTBEAT = load_bench.SERVER_ROUTES["heartbeat"]


def _scrape(**by_route: dict[float, float]) -> dict[str, dict[float, float]]:
    return {HEARTBEAT if k == "heartbeat" else k: v for k, v in by_route.items()}


def test_the_quantile_is_the_bound_of_the_bucket_holding_it_between_two_scrapes() -> None:
    before = _scrape(heartbeat={0.025: 10.0, 0.25: 10.0, 2.5: 10.0, math.inf: 10.0})
    # 1,000 more: 980 under 25 ms, 15 more under 250 ms, 5 more under 2.5 s
    after = _scrape(heartbeat={0.025: 990.0, 0.25: 1005.0, 2.5: 1010.0, math.inf: 1010.0})
    assert load_bench.bucket_quantile(before, after, HEARTBEAT, 0.99) == (0.25, 1000)
    assert load_bench.bucket_quantile(before, after, HEARTBEAT, 0.5) == (0.025, 1000)
    # past the last finite bucket: inf
    slow = _scrape(heartbeat={0.025: 10.0, 0.25: 10.0, 2.5: 10.0, math.inf: 110.0})
    assert load_bench.bucket_quantile(before, slow, HEARTBEAT, 0.99) == (math.inf, 100)
    assert load_bench.bucket_quantile(before, after, "/nothing", 0.99) == (math.inf, 0)


def test_the_line_gives_the_window_and_its_halves_and_leaves_out_routes_without_requests() -> None:
    start = _scrape(heartbeat={0.05: 0.0, 5.0: 0.0, math.inf: 0.0})
    mid = _scrape(heartbeat={0.05: 100.0, 5.0: 100.0, math.inf: 100.0})
    end = _scrape(heartbeat={0.05: 100.0, 5.0: 200.0, math.inf: 200.0})
    line = load_bench.server_line([start, mid, end])
    assert line == ("coordinator's own timing (its request-duration histogram's buckets): heartbeat p99 "
                    "<= 5000 ms (200 requests; halves <= 50 ms / <= 5000 ms)")
