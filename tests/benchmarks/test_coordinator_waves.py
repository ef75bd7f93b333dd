"""benchmarks/coordinator_load.py's waves line: requests counted per 10 s slice of the window, so a fleet
whose heartbeats lined up (issue 33's 20,000 workers) shows as a max far above the median."""

from __future__ import annotations

from . import load

load_bench = load("coordinator_load")


def test_an_even_stream_and_a_wave() -> None:
    start, wall = 100.0, 60.0
    even = [start + i * 0.5 for i in range(120)]  # 20 a slice
    line = load_bench.waves("heartbeat", [0.01] * len(even), even, start, wall)
    assert line == ("heartbeat per 10 s: min 20, median 20, max 20 (max/median 1.00); "
                    "the worst slice's p99 10.0 ms")
    # the same count, lined up: 100 in the third slice, slow, 4 in each other
    wave = [start + 20 + i * 0.05 for i in range(100)] + [start + s * 10 + 1 + i for s in (0, 1, 3, 4, 5)
                                                         for i in range(4)]
    latency = [0.5] * 100 + [0.01] * 20
    line = load_bench.waves("heartbeat", latency, wave, start, wall)
    assert line == ("heartbeat per 10 s: min 4, median 4, max 100 (max/median 25.00); "
                    "the worst slice's p99 500.0 ms")


def test_requests_outside_the_window_are_left_out() -> None:
    slices = load_bench.buckets([1.0, 2.0, 3.0], [99.0, 105.0, 200.0], 100.0, 20.0)
    assert slices == [[2.0], []]
