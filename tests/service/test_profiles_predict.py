"""Learned predictions (service/predict.py) on synthetic observations."""

from __future__ import annotations

import math

import pytest

from kernelfleet.service.predict import SourcePick, chip_similarity, predict, shape_distance, transfer_score

K = "rmsnorm"


def test_nearby_shapes_on_the_same_chip_decide() -> None:
    obs = {
        "A": {
            (K, "4096x4096", "float16"): {"a": 10.0, "b": 12.0, "builtin": 15.0},
            (K, "1024x4096", "float16"): {"a": 3.0, "b": 3.5, "builtin": 4.0},
            (K, "16x128", "float16"): {"a": 2.0, "b": 1.0, "builtin": 1.5},
        }
    }
    p = predict("A", K, "2048x4096", "float16", obs)
    assert p is not None and p.config_key == "a"
    # expected time scales with the element count of the sources (weighted), speedup vs the built-in
    # (1024x4096: 3.0 x 2, 4096x4096: 10.0 / 2, equal weights; 16x128 is too far to count)
    assert p.median_us == pytest.approx(5.5) and p.speedup == pytest.approx((0.5 * 8 + 0.5 * 7.5) / 5.5)
    assert p.basis[0]["shape"] in ("1024x4096", "4096x4096")
    # the tuned shape itself is not predicted from itself; an invalid config is never proposed
    assert predict("A", K, "4096x4096", "float16", obs).config_key == "a"
    assert predict("A", K, "2048x4096", "float16", obs, valid=lambda k: k != "a").config_key == "b"
    assert predict("A", "softmax", "2048x4096", "float16", obs) is None
    assert predict("A", K, "2048x4096x2", "float16", obs) is None  # no source of that rank


def test_similar_chips_count_by_how_well_their_choices_do() -> None:
    agree = {(K, f"{n}x4096", "float16"): {"a": 1.0 * n, "b": 1.3 * n} for n in (256, 1024)}
    disagree = {(K, f"{n}x4096", "float16"): {"a": 1.4 * n, "b": 1.0 * n} for n in (256, 1024)}
    obs = {"A": agree, "Twin": dict(agree), "Other": disagree}
    assert chip_similarity("A", "Twin", obs) > 0.7 > 0.01 > chip_similarity("A", "Other", obs)
    obs["Twin"][(K, "8192x4096", "float16")] = {"a": 9.0, "b": 11.0}
    obs["Other"][(K, "8192x4096", "float16")] = {"a": 11.0, "b": 9.0}
    p = predict("A", K, "8192x4096", "float16", obs)
    assert p is not None and p.config_key == "a"
    # with no shared measurements, the chip table's similarity (generation, cores, bandwidth), capped
    # below the chip's own weight; chips the table cannot compare (unknown, another backend) give nothing
    pro = chip_similarity("Apple M3 Max", "Apple M3 Pro", {})
    m1 = chip_similarity("Apple M3 Max", "Apple M1", {})
    assert 0 < m1 < pro < chip_similarity("A", "A", {}) == 1.0
    assert chip_similarity("Apple M3 Max", "NVIDIA H100 80GB HBM3", {}) == 0.0
    assert chip_similarity("Apple M3 Max", "AMD EPYC 7763", {}) == 0.0
    assert shape_distance("1x4096", "1x4096") == 0.0 and shape_distance("1x2", "1x2x3") is None
    # the total size, plus the dimensions after the first: twice the rows is one size step; the same
    # size with another row length is one row-length step; both at once count both
    assert shape_distance("1024x4096", "2048x4096") == pytest.approx(math.log(2))
    assert shape_distance("2048x8192", "4096x4096") == pytest.approx(math.log(2))
    assert shape_distance("1024x4096", "2048x8192") == pytest.approx(3 * math.log(2))


def test_the_config_most_often_near_the_best_wins() -> None:
    # "a" is the best at the two nearest row counts and 3x slower at the two far ones; "b" is 6 %
    # behind at the near ones and the best at the far ones. A weighted mean of relative times would
    # pick "b" (1.05 against 1.4); the vote picks "a", near the best where the weight is.
    obs = {"A": {
        (K, "1024x4096", "float16"): {"a": 10.0, "b": 10.6},
        (K, "4096x4096", "float16"): {"a": 40.0, "b": 42.4},
        (K, "512x4096", "float16"): {"a": 15.0, "b": 5.0},
        (K, "8192x4096", "float16"): {"a": 240.0, "b": 80.0},
    }}
    p = predict("A", K, "2048x4096", "float16", obs)
    assert p is not None and p.config_key == "a"


def test_predictions_never_cross_backends_through_the_chip_table() -> None:
    """A Metal chip with no data of its own gets nothing from CUDA or CPU observations, even where a
    CUDA chip measured exactly the shape asked for."""
    obs = {
        "NVIDIA H100 80GB HBM3": {(K, "4096x4096", "float16"): {"a": 10.0, "builtin": 20.0}},
        "AMD EPYC 7763": {(K, "4096x4096", "float16"): {"builtin": 900.0}},
    }
    assert predict("Apple M3 Max", K, "4096x4096", "float16", obs) is None
    obs["Apple M3 Pro"] = {(K, "4096x4096", "float16"): {"b": 30.0, "builtin": 40.0}}
    p = predict("Apple M3 Max", K, "4096x4096", "float16", obs)
    assert p is not None and p.config_key == "b" and p.cross_chip
    assert {b["chip"] for b in p.basis} == {"Apple M3 Pro"}


def test_score_rises_with_agreement_and_nearby_evidence() -> None:
    near = {"A": {(K, f"{n}x4096", "float16"): {"a": n * 1.0, "b": n * 1.2} for n in (1024, 4096)}}
    split = {"A": {(K, "1024x4096", "float16"): {"a": 1024.0, "b": 1300.0},
                   (K, "4096x4096", "float16"): {"a": 5000.0, "b": 4096.0}}}
    far = {"A": {(K, "64x4096", "float16"): {"a": 64.0, "b": 80.0}}}
    agreed, disputed, distant = (predict("A", K, "2048x4096", "float16", o) for o in (near, split, far))
    assert agreed is not None and disputed is not None and distant is not None
    assert agreed.score == pytest.approx(agreed.nearest / (agreed.nearest + 0.002))
    assert agreed.near_share == 1.0 and disputed.near_share == pytest.approx(0.5)
    assert agreed.score > disputed.score and agreed.score > distant.score


def test_another_chip_that_measured_the_very_shape_decides_alone() -> None:
    # the H100 measured 4096x4096 ("a" best) and many other sizes where "b" wins: for the H200, which
    # measured nothing of the kernel, the exact shape decides; with data of its own, every source counts
    other_sizes = {(K, f"{n}x4096", "float16"): {"a": 1.2 * n, "b": 1.0 * n}
                   for n in (1024, 2048, 8192, 16384)}
    h100 = {**other_sizes, (K, "4096x4096", "float16"): {"a": 1.0, "b": 1.3}}
    obs = {"NVIDIA H100 80GB HBM3": h100}
    p = predict("NVIDIA H200", K, "4096x4096", "float16", obs)
    assert p is not None and p.config_key == "a" and p.cross_chip
    assert [b["shape"] for b in p.basis] == ["4096x4096"]
    obs["NVIDIA H200"] = {(K, "2048x4096", "float16"): {"a": 2.4, "b": 2.0}}
    own = predict("NVIDIA H200", K, "4096x4096", "float16", obs)
    assert own is not None and not own.cross_chip
    assert {b["chip"] for b in own.basis} == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}


def test_a_chip_with_more_bandwidth_breaks_the_sources_ties_by_work_per_thread() -> None:
    # on the H100 three configs tie within 2 %; the H200 (4.8 vs 3.35 TB/s) takes the one with the most
    # elements per thread (ipt x vec); a chip with less bandwidth keeps the fastest on the source
    times = {"ipt=1,tg=256,vec=4": 100.0, "ipt=2,tg=64,vec=8": 101.5, "ipt=4,tg=64,vec=8": 104.0,
             "ipt=1,tg=128,vec=2": 101.0, "builtin": 130.0}
    obs = {"NVIDIA H100 80GB HBM3": {("swiglu", "16384x8192", "bfloat16"): times}}
    h200 = predict("NVIDIA H200", "swiglu", "16384x8192", "bfloat16", obs)
    assert h200 is not None and h200.config_key == "ipt=2,tg=64,vec=8"  # 104.0 is past the 2 % band
    a100 = predict("NVIDIA A100 80GB", "swiglu", "16384x8192", "bfloat16", obs)
    assert a100 is not None and a100.config_key == "ipt=1,tg=256,vec=4"


def test_a_transfer_takes_the_source_chips_measured_pick_scored_by_its_margin() -> None:
    # the H100's table has "b" fastest by centers, but its measured pick (best same-run speedup) is "a"
    h100 = {("swiglu", "4096x14336", "bfloat16"): {"a": 101.0, "b": 100.0, "builtin": 130.0}}
    obs = {"NVIDIA H100 80GB HBM3": h100}
    picks = {("NVIDIA H100 80GB HBM3", "swiglu", "4096x14336", "bfloat16"): SourcePick("a", 1.28)}
    p = predict("NVIDIA H200", "swiglu", "4096x14336", "bfloat16", obs, picks=picks)
    assert p is not None and p.transfer and p.mode == "transfer" and p.config_key == "a"
    assert p.speedup == 1.28 and p.median_us == 101.0
    assert p.score == pytest.approx(transfer_score(1.28)) == pytest.approx(1 - 1.28 ** (-1 / 0.15))
    # a thin margin scores low, no margin scores 0, a wide one near 1
    assert transfer_score(1.0) == 0.0 < transfer_score(1.05) < 0.3 < transfer_score(1.2) < transfer_score(2.0)
    assert transfer_score(2.0) > 0.98
    # a pick the target cannot run is no transfer: the sources vote instead
    voted = predict("NVIDIA H200", "swiglu", "4096x14336", "bfloat16", obs, picks=picks,
                    valid=lambda k: k != "a")
    assert voted is not None and not voted.transfer and voted.config_key == "b"
    # the target's own data make it an own-chip prediction, never a transfer
    obs["NVIDIA H200"] = {("swiglu", "4096x8192", "bfloat16"): {"a": 60.0, "b": 50.0, "builtin": 70.0}}
    own = predict("NVIDIA H200", "swiglu", "4096x14336", "bfloat16", obs, picks=picks)
    assert own is not None and not own.transfer and own.mode == "own"
