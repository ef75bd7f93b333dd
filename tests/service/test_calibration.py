"""Prediction confidence calibrated on held-out data (service/calibration.py), on synthetic fleets
whose right answers are known."""

from __future__ import annotations

import pytest

from kernelfleet.service import calibration
from kernelfleet.service.calibration import Sample
from kernelfleet.service.predict import Prediction, SourcePick, predict

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
    # a lone bin's rate is (hits + 1) / (n + 2): a bin with little data says little
    (only,) = [row for row in table_steady if row["n"]]
    assert only["rate"] == (only["hits"] + 1) / (only["n"] + 2)


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


def sample(mode: str, score: float, hit: bool) -> Sample:
    return Sample(mode, score, hit, "Apple M3 Max", K, "64x4096", "float16")


def test_rates_rise_with_the_score_and_empty_bins_take_the_least_the_order_allows() -> None:
    # 0.2-0.4: 6/10 hits, 0.4-0.6: 2/10 (a lone low bin above a higher one), 0.9-1.0: 9/10
    samples = [sample("transfer", score, i < hits) for score, hits in ((0.3, 6), (0.5, 2), (0.95, 9))
               for i in range(10)]
    rows = [r for r in calibration.bins(samples) if r["mode"] == "transfer"]
    rates = [r["rate"] for r in rows]
    assert rates == sorted(rates)  # non-decreasing in the score
    by_lo = {r["lo"]: r for r in rows}
    # the two disagreeing bins pool: (7 + 1 + 3) / (12 + 12), weighted by n + 2
    assert by_lo[0.2]["rate"] == by_lo[0.4]["rate"] == pytest.approx((7 / 12 + 3 / 12) / 2)
    assert by_lo[0.9]["rate"] == pytest.approx(10 / 12)
    # an empty bin takes the filled bin below it (0.6-0.9 -> the 0.4 bin's), never the higher one above;
    # with none below, the prior 0.5 or the bin above, whichever is less
    assert by_lo[0.7]["n"] == 0 and by_lo[0.7]["rate"] == by_lo[0.4]["rate"]
    assert by_lo[0.0]["rate"] == min(0.5, by_lo[0.2]["rate"]) == by_lo[0.2]["rate"]
    lone = [r for r in calibration.bins([sample("own", 0.95, True)] * 20) if r["mode"] == "own"]
    assert [r["rate"] for r in lone] == [0.5] * 6 + [21 / 22]  # a lone high bin lends the lower ones nothing
    # a mode without samples says nothing
    assert {r["rate"] for r in calibration.bins(samples) if r["mode"] == "cross"} == {0.5}
    pick = Prediction("a", 1.0, 1.2, 0.95, cross_chip=True, transfer=True)
    assert pick.mode == "transfer"
    assert calibration.confidence(calibration.bins(samples), pick) == pytest.approx(10 / 12)


def test_a_transfer_is_its_own_mode_and_hits_against_the_chips_tuned_pick() -> None:
    # two chips measured the same shapes; each one's measured pick transfers to the other
    shapes = [f"{2 ** i}x4096" for i in range(6, 10)]
    obs = {"Apple M3 Max": {(K, s, "float16"): {"a": 10.0, "b": 10.4, "builtin": 13.0} for s in shapes},
           "Apple M3 Pro": {(K, s, "float16"): {"a": 10.0, "b": 12.0, "builtin": 13.0} for s in shapes}}
    picks = {(c, K, s, "float16"): SourcePick("a", 1.3) for c in obs for s in shapes}
    samples = calibration.held_out(obs, picks=picks)
    transfer = [s for s in samples if s.mode == "transfer"]
    assert len(transfer) == 8 and all(s.hit for s in transfer)
    # every held-out shape was measured by the other chip
    assert not [s for s in samples if s.mode == "cross"]
    # the M3 Max's tuned pick is "b" (say, its same-run speedup was the best): "a" 10.0 is within 5 % of
    # it, so still a hit; against a tuned pick 10 % faster than "a", a miss
    obs["Apple M3 Max"][(K, shapes[0], "float16")] = {"a": 10.0, "b": 9.0, "builtin": 13.0}
    picks[("Apple M3 Max", K, shapes[0], "float16")] = SourcePick("b", 1.44)
    missed = [s for s in calibration.held_out(obs, picks=picks)
              if s.mode == "transfer" and s.chip == "Apple M3 Max" and s.shape == shapes[0]]
    assert [s.hit for s in missed] == [False]
