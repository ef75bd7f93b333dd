"""Prediction confidence calibrated on held-out data (service/calibration.py), on synthetic fleets
whose right answers are known."""

from __future__ import annotations

from kernelfleet.service import calibration
from kernelfleet.service.predict import predict

K = "rmsnorm"


def fleet(winner_at: dict[int, str]) -> dict[str, dict[tuple[str, str, str], dict[str, float]]]:
    """One chip: at each row count, the named config is 30 % faster than the other."""
    return {"Apple M3 Max": {
        (K, f"{rows}x4096", "float16"): {"a": 10.0 if w == "a" else 13.0, "b": 10.0 if w == "b" else 13.0}
        for rows, w in winner_at.items()}}


def test_consistent_fleets_calibrate_high_and_mixed_ones_low() -> None:
    steady = calibration.held_out(fleet({2 ** i: "a" for i in range(4, 12)}))
    assert steady and all(s.mode == "own" and s.hit for s in steady)
    # alternating winners: a held-out shape's neighbours both vote for the other config
    mixed = calibration.held_out(fleet({2 ** i: "ab"[i % 2] for i in range(4, 12)}))
    assert sum(s.hit for s in mixed) < len(mixed) / 2
    table_steady, table_mixed = calibration.bins(steady), calibration.bins(mixed)
    pick = predict("Apple M3 Max", K, "3000x4096", "float16", fleet({2 ** i: "a" for i in range(4, 12)}))
    assert pick is not None and pick.config_key == "a"
    # the same pick is trusted after a history of hits and not after a history of misses
    assert calibration.confidence(table_steady, pick) > 0.8 > calibration.confidence(table_mixed, pick)
    # rates are (hits + 1) / (n + 2): a bin with little data says little
    for row in table_steady:
        assert row["rate"] == (row["hits"] + 1) / (row["n"] + 2)


def test_no_calibration_means_no_information_and_the_sample_is_bounded() -> None:
    pick = predict("Apple M3 Max", K, "3000x4096", "float16", fleet({1024: "a", 4096: "a"}))
    assert pick is not None and calibration.confidence(None, pick) == 0.5
    big = fleet({n: "a" for n in range(1, 301)})
    assert len(calibration.held_out(big, limit=40)) == 40
    # the sample is stable: the same series each time
    again = calibration.held_out(big, limit=40)
    assert [s.shape for s in again] == [s.shape for s in calibration.held_out(big, limit=40)]


def test_cross_chip_samples_leave_the_chip_out() -> None:
    obs = fleet({2 ** i: "a" for i in range(6, 10)})
    obs["Apple M3 Pro"] = {(K, f"{2 ** i}x4096", "float16"): {"a": 10.0, "b": 12.0} for i in range(6, 10)}
    samples = calibration.held_out(obs)
    cross = [s for s in samples if s.mode == "cross"]
    assert cross and all(s.hit for s in cross)
    assert {s.chip for s in cross} == {"Apple M3 Max", "Apple M3 Pro"}
