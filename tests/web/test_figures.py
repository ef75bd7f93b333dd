"""Every figure builder's JSON is a valid Plotly figure (the pages serialize without validating)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import plotly.graph_objects as go
import pytest

from kernelfleet.web import figures as F
from kernelfleet.web import search_figures as S

T0 = datetime(2026, 11, 1, 12, 0)
POINTS = [
    F.RunPoint(i, T0 + timedelta(hours=i), d, 10.0 + i, 9.5 + i, 11.0 + i, v, "tg=256,vec=4")
    for i, (d, v) in enumerate([("float16", "0.32.3"), ("float32", "0.32.3"), ("float16", "0.32.4")])
]

MEASURED = [S.Measured("builtin", 12.0)] + [
    S.Measured(f"tg={tg},vec={vec}", 10.0 + tg / 256 + vec) for tg in (128, 256, 512) for vec in (2, 4)
]

BUILDERS = {
    "series": lambda: F.series_figure(POINTS, highlight=[1], hlines=[(10.0, "baseline 10 µs")]),
    "speedup": lambda: F.speedup_figure(
        ["32x4096", "4096x4096"], ["A", "B"], {("A", "32x4096"): 1.2, ("B", "4096x4096"): None}
    ),
    "heatmap": lambda: F.config_heatmap(
        ["32x4096", "4096x4096"],
        ["A", "B"],
        {("A", "32x4096"): "builtin", ("B", "4096x4096"): "tg=128,vec=2"},
    ),
    "ratio": lambda: F.ratio_figure(["rmsnorm", "softmax"], [0.8, 1.2], "A", "B"),
    "per_day": lambda: F.results_per_day_figure(
        ["2026-11-01", "2026-11-02"], ["w1"], {("w1", "2026-11-02"): 4}
    ),
    "param": lambda: S.param_figure(MEASURED, "tg", 12.0),
    "bandwidth": lambda: S.bandwidth_figure(MEASURED, 64 * 2**20, 400.0, "Apple M3 Max"),
    "samples": lambda: F.samples_figure([("tg=256,vec=4", [1.0, 1.1, 1.2]), ("builtin", [1.5, 1.6])]),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_figure_is_valid_plotly(name: str) -> None:
    fig = json.loads(BUILDERS[name]())
    checked = go.Figure(fig)  # raises ValueError on any property plotly does not know
    assert len(checked.data) == len(fig["data"]) > 0


def test_series_figure_traces() -> None:
    fig = json.loads(BUILDERS["series"]())
    names = [t["name"] for t in fig["data"]]
    assert names == [
        "float16 p90",
        "float16 p10–p90",
        "float16",
        "float32 p90",
        "float32 p10–p90",
        "float32",
        "MLX 0.32.3",
        "MLX 0.32.4",
        "flagged run",
    ]
    by = {t["name"]: t for t in fig["data"]}
    assert by["float16"]["y"] == [10.0, 12.0] and by["float16 p10–p90"]["y"] == [9.5, 11.5]
    assert [c[0] for c in by["MLX 0.32.3"]["customdata"]] == [0, 1]
    assert by["MLX 0.32.3"]["marker"]["symbol"] != by["MLX 0.32.4"]["marker"]["symbol"]
    assert by["flagged run"]["y"] == [11.0]


def test_geomean() -> None:
    assert F.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert F.geomean([]) is None


def test_golden_drift_compares_only_runs_with_the_same_seed() -> None:
    from kernelfleet.web.tolerance import Bound, compare_golden

    a = {"digest": "x", "sample": [1.0, 2.0], "stride": 1, "numel": 2, "seed": 0}
    b = dict(a, digest="y", sample=[1.0, 2.5])
    bound = Bound(1e-3, 1e-3, "test")
    assert compare_golden(a, b, bound).beyond
    other_seed = compare_golden(a, dict(b, seed=7), bound)
    assert not other_seed.comparable and "seed" in other_seed.reason
    assert compare_golden(a, {k: v for k, v in b.items() if k != "seed"}, bound).beyond  # old rows: seed 0


def test_single_run_series_gets_a_readable_date_range() -> None:
    """One run (or several within a minute) would otherwise get ticks like 10:29:47.9995."""
    fig = json.loads(F.series_figure(POINTS[:1]))
    lo, hi = (datetime.fromisoformat(x) for x in fig["layout"]["xaxis"]["range"])
    assert hi - lo == timedelta(hours=24)
    assert "range" not in json.loads(F.series_figure(POINTS))["layout"]["xaxis"]  # 2 h apart: plotly's own


def test_times_of_10_ms_and_more_are_drawn_in_ms() -> None:
    slow = [F.RunPoint(1, T0, "float32", 120_000.0, 118_000.0, 125_000.0, "0.32.4", "tg=256")]
    fig = json.loads(F.series_figure(slow, hlines=[(100_000.0, "baseline")]))
    assert fig["layout"]["yaxis"]["title"]["text"] == "best time (ms)"
    line = next(t for t in fig["data"] if t["name"] == "float32")
    assert line["y"] == [120.0]
    assert fig["layout"]["shapes"][0]["y0"] == 100.0
    fast = json.loads(F.series_figure(POINTS))
    assert fast["layout"]["yaxis"]["title"]["text"] == "best time (µs)"
    boxes = json.loads(F.samples_figure([("tg=256", [20_000.0, 21_000.0])]))
    assert boxes["data"][0]["x"] == [20.0, 21.0] and "(ms)" in boxes["layout"]["xaxis"]["title"]["text"]


def test_box_plot_configs_are_rows_not_crowded_columns() -> None:
    keys = [f"rows={r},tg={t},vec=4" for r in (1, 2, 4) for t in (128, 256, 512)]
    fig = json.loads(F.samples_figure([(k, [1.0, 1.1]) for k in keys]))
    assert all(t["orientation"] == "h" and t["name"] == k for t, k in zip(fig["data"], keys, strict=True))
    assert fig["layout"]["height"] >= 30 * len(keys)  # one row of at least 30 px per config


def test_param_figure_shows_every_config_and_the_fastest_per_value() -> None:
    assert S.parameters(MEASURED) == ["tg", "vec"]
    assert S.parameters([S.Measured("tg=128,vec=4", 1.0), S.Measured("tg=256,vec=4", 2.0)]) == ["tg"]
    fig = json.loads(S.param_figure(MEASURED, "tg", 12.0))
    configs, fastest = fig["data"]
    assert sorted(configs["text"]) == sorted(m.config_key for m in MEASURED[1:])
    assert fastest["x"] == ["128", "256", "512"]  # numeric order, not text order
    assert fastest["y"] == [10.0 + 0.5 + 2, 10.0 + 1 + 2, 10.0 + 2 + 2]
    assert fig["layout"]["shapes"][0]["y0"] == 12.0  # the built-in


def test_bandwidth_figure_is_bytes_over_median_against_the_chip() -> None:
    nbytes = 64 * 2**20
    fig = json.loads(S.bandwidth_figure(MEASURED, nbytes, 400.0, "Apple M3 Max"))
    bars = fig["data"][0]
    fastest = min(MEASURED, key=lambda m: m.median_us)
    assert bars["y"][0] == fastest.config_key
    assert bars["x"][0] == pytest.approx(nbytes / (fastest.median_us * 1e-6) / 1e9)
    assert fig["layout"]["shapes"][0]["x0"] == 400.0
    assert "400 GB/s" in fig["layout"]["annotations"][0]["text"]
    unknown = json.loads(S.bandwidth_figure(MEASURED, nbytes, None, "cpu"))
    assert unknown["layout"]["shapes"] == []


def test_runs_are_drawn_when_they_were_measured_not_when_stored() -> None:
    """An imported run (stored today, measured last week) sits at its measurement time, in order."""
    stored = T0 + timedelta(days=7)
    imported = F.RunPoint(2, stored, "float32", 12.0, 11.5, 12.5, "0.32.4", "tg=256", measured_at=T0)
    live = F.RunPoint(1, T0 + timedelta(days=3), "float32", 10.0, 9.5, 10.5, "0.32.4", "tg=256")
    old_report = F.RunPoint(3, T0 + timedelta(days=5), "float32", 11.0, 10.5, 11.5, "0.32.4", "tg=256")
    fig = json.loads(F.series_figure([live, imported, old_report]))
    line = next(t for t in fig["data"] if t["name"] == "float32")
    assert line["x"] == [F._iso(T0), F._iso(T0 + timedelta(days=3)), F._iso(T0 + timedelta(days=5))]
    assert line["y"] == [12.0, 10.0, 11.0]
