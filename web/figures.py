"""Plotly figure builders. Each takes rows already aggregated in SQL and returns the figure's JSON
(``plotly.io.to_json``), drawn in the browser by plotly.js served from :mod:`kernelfleet.web.router`.
Trace names are stable: the browser tests read them back from the page.

Figures are assembled as plain dicts and serialized without plotly's per-request validation:
building ``plotly.graph_objects.Figure`` objects costs ~20 ms per chart (a page of 20 evidence
charts would take 400 ms), serializing the dict ~0.2 ms. tests/web/test_figures.py validates every
builder's output against plotly's schema with ``go.Figure(...)`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import plotly.io as pio

from kernelfleet.web.render import utc

PALETTE = [
    "#2563eb",
    "#ea580c",
    "#16a34a",
    "#9333ea",
    "#dc2626",
    "#0891b2",
    "#ca8a04",
    "#db2777",
    "#4b5563",
    "#65a30d",
]
SYMBOLS = ["circle", "diamond", "square", "triangle-up", "x", "star", "cross", "triangle-down"]
AXIS = {"gridcolor": "#eef0f3", "linecolor": "#cbd5e1", "zeroline": False, "automargin": True}

Trace = dict[str, Any]


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _layout(
    *, height: int = 300, y_title: str | None = None, x_title: str | None = None, **extra: Any
) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "template": "none",
        "height": height,
        "margin": {"l": 64, "r": 16, "t": 28, "b": 44},
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1f2937"},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "hovermode": "closest",
        "legend": {
            "orientation": "h",
            "yanchor": "bottom",
            "y": 1.0,
            "xanchor": "left",
            "x": 0,
            "font": {"size": 11},
        },
        "xaxis": {**AXIS, "title": {"text": x_title}},
        "yaxis": {**AXIS, "title": {"text": y_title}},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _json(data: list[Trace], layout: dict[str, Any]) -> str:
    return str(pio.to_json({"data": data, "layout": layout}, validate=False))


def _iso(value: datetime | None) -> str | None:
    v = utc(value)
    return None if v is None else v.strftime("%Y-%m-%d %H:%M:%S")


def time_unit(values: Sequence[float | None]) -> tuple[float, str]:
    """(divisor, unit) for an axis of times given in µs: ms once the largest is 10,000 µs or more,
    so an axis reads "120 ms", not "120k µs"."""
    top = max((v for v in values if v is not None), default=0.0)
    return (1000.0, "ms") if top >= 10_000 else (1.0, "µs")


def _scaled(values: Sequence[float | None], div: float) -> list[float | None]:
    return [None if v is None else v / div for v in values]


def _single_time_range(xs: Sequence[str | None]) -> dict[str, Any]:
    """An x range of ±12 h around runs that all fall within a minute: plotly would zoom its date
    ticks to fractions of a second ("10:29:47.9995") to spread one point."""
    times = sorted({datetime.strptime(x, "%Y-%m-%d %H:%M:%S") for x in xs if x})
    if not times or (times[-1] - times[0]).total_seconds() >= 60:
        return {}
    lo, hi = times[0] - timedelta(hours=12), times[-1] + timedelta(hours=12)
    return {"range": [lo.strftime("%Y-%m-%d %H:%M:%S"), hi.strftime("%Y-%m-%d %H:%M:%S")]}


@dataclass(frozen=True)
class RunPoint:
    """One run of a series: its best time, that trial's p10/p90 and what it ran on."""

    result_id: int
    created_at: datetime  # when the coordinator stored it
    dtype: str
    best_us: float
    p10_us: float | None
    p90_us: float | None
    mlx_version: str
    config_key: str | None
    measured_at: datetime | None = None  # the worker's clock when it measured (older reports lack it)

    @property
    def at(self) -> datetime:
        """When the run happened: the worker's ``measured_at``, else the time it was stored (an
        imported run is dated by its measurement, not by the import)."""
        at = utc(self.measured_at) or utc(self.created_at)
        assert at is not None
        return at


def series_figure(
    points: Sequence[RunPoint], *, highlight: Sequence[int] = (), hlines: Sequence[tuple[float, str]] = ()
) -> str:
    """Best time per run over time: one line and p10–p90 band per dtype, marker symbols by MLX
    version (traces ``"<dtype>"``, ``"<dtype> p10–p90"`` and ``"MLX <version>"``)."""
    data: list[Trace] = []
    div, unit = time_unit([p.p90_us if p.p90_us is not None else p.best_us for p in points])
    dtypes = sorted({p.dtype for p in points})
    points = sorted(points, key=lambda p: (p.at, p.result_id))
    for i, dtype in enumerate(dtypes):
        color = PALETTE[i % len(PALETTE)]
        pts = [p for p in points if p.dtype == dtype]
        xs = [_iso(p.at) for p in pts]
        hi = _scaled([p.p90_us if p.p90_us is not None else p.best_us for p in pts], div)
        lo = _scaled([p.p10_us if p.p10_us is not None else p.best_us for p in pts], div)
        data.append(
            {
                "type": "scatter",
                "x": xs,
                "y": hi,
                "mode": "lines",
                "line": {"width": 0},
                "hoverinfo": "skip",
                "showlegend": False,
                "legendgroup": dtype,
                "name": f"{dtype} p90",
            }
        )
        data.append(
            {
                "type": "scatter",
                "x": xs,
                "y": lo,
                "mode": "lines",
                "line": {"width": 0},
                "fill": "tonexty",
                "fillcolor": _rgba(color, 0.18),
                "hoverinfo": "skip",
                "legendgroup": dtype,
                "name": f"{dtype} p10–p90",
                "showlegend": False,
            }
        )
        data.append(
            {
                "type": "scatter",
                "x": xs,
                "y": _scaled([p.best_us for p in pts], div),
                "mode": "lines",
                "name": dtype,
                "legendgroup": dtype,
                "line": {"color": color, "width": 1.6},
                "hoverinfo": "skip",
            }
        )
    versions = sorted({p.mlx_version for p in points})
    for j, version in enumerate(versions):
        pts = [p for p in points if p.mlx_version == version]
        data.append(
            {
                "type": "scatter",
                "x": [_iso(p.at) for p in pts],
                "y": _scaled([p.best_us for p in pts], div),
                "mode": "markers",
                "name": f"MLX {version}",
                "marker": {
                    "symbol": SYMBOLS[j % len(SYMBOLS)],
                    "size": 7,
                    "color": [PALETTE[dtypes.index(p.dtype) % len(PALETTE)] for p in pts],
                    "line": {"width": 1, "color": "white"},
                },
                "customdata": [
                    [p.result_id, p.dtype, p.config_key or "—", (p.p10_us or p.best_us) / div,
                     (p.p90_us or p.best_us) / div]
                    for p in pts
                ],
                "hovertemplate": (
                    f"%{{x}}<br>%{{customdata[1]}}: <b>%{{y:.2f}} {unit}</b> (p10 %{{customdata[3]:.2f}}, "
                    "p90 %{customdata[4]:.2f})<br>config %{customdata[2]}<br>"
                    f"MLX {version}<extra>run %{{customdata[0]}}</extra>"
                ),
            }
        )
    if highlight:
        wanted = set(highlight)
        hl = [p for p in points if p.result_id in wanted]
        data.append(
            {
                "type": "scatter",
                "x": [_iso(p.at) for p in hl],
                "y": _scaled([p.best_us for p in hl], div),
                "mode": "markers",
                "name": "flagged run",
                "hoverinfo": "skip",
                "marker": {"symbol": "circle-open", "size": 16, "color": "#dc2626", "line": {"width": 2}},
            }
        )
    shapes = [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "y0": y / div,
            "y1": y / div,
            "line": {"dash": "dot", "color": "#64748b", "width": 1},
        }
        for y, _ in hlines
    ]
    notes = [
        {
            "xref": "paper",
            "x": 0,
            "y": y / div,
            "text": label,
            "showarrow": False,
            "xanchor": "left",
            "yanchor": "bottom",
            "font": {"size": 10, "color": "#64748b"},
        }
        for y, label in hlines
    ]
    xrange = _single_time_range([_iso(p.at) for p in points])
    return _json(data, _layout(y_title=f"best time ({unit})", shapes=shapes, annotations=notes, xaxis=xrange))


def speedup_figure(
    shapes: Sequence[str], chips: Sequence[str], speedups: dict[tuple[str, str], float | None]
) -> str:
    """Grouped bars: speedup over the built-in per shape, one trace per chip."""
    data: list[Trace] = [
        {
            "type": "bar",
            "x": list(shapes),
            "y": [speedups.get((chip, s)) for s in shapes],
            "name": chip,
            "marker": {"color": PALETTE[i % len(PALETTE)]},
            "hovertemplate": f"{chip}<br>" + "%{x}: %{y:.2f}× the built-in<extra></extra>",
        }
        for i, chip in enumerate(chips)
    ]
    line = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "y0": 1,
        "y1": 1,
        "line": {"color": "#334155", "width": 1},
    }
    return _json(
        data,
        _layout(
            height=320,
            y_title="speedup over built-in (×)",
            barmode="group",
            shapes=[line],
            xaxis={"type": "category"},
        ),
    )


def config_heatmap(shapes: Sequence[str], chips: Sequence[str], configs: dict[tuple[str, str], str]) -> str:
    """The best config per (chip, shape) as a categorical heatmap; the cell text is the config."""
    keys = sorted(set(configs.values()))
    index = {k: i for i, k in enumerate(keys)}
    n = max(len(keys), 1)
    scale: list[list[Any]] = []
    for i in range(n):
        color = (
            "#cbd5e1" if i < len(keys) and keys[i] == "builtin" else _rgba(PALETTE[i % len(PALETTE)], 0.45)
        )
        scale += [[i / n, color], [(i + 1) / n, color]]
    trace: Trace = {
        "type": "heatmap",
        "name": "best config",
        "x": list(shapes),
        "y": list(chips),
        "z": [[float(index[configs[(c, s)]]) if (c, s) in configs else None for s in shapes] for c in chips],
        "text": [[configs.get((c, s), "") for s in shapes] for c in chips],
        "texttemplate": "%{text}",
        "textfont": {"size": 10},
        "colorscale": scale,
        "zmin": -0.5,
        "zmax": n - 0.5,
        "showscale": False,
        "xgap": 2,
        "ygap": 2,
        "hovertemplate": "%{y}<br>%{x}<br>best config: %{text}<extra></extra>",
    }
    return _json(
        [trace],
        _layout(
            height=max(160, 70 + 44 * len(chips)),
            margin={"l": 16, "r": 16, "t": 16, "b": 44},
            xaxis={"type": "category", "gridcolor": "white"},
            yaxis={"type": "category", "autorange": "reversed", "gridcolor": "white"},
        ),
    )


def ratio_figure(kernels: Sequence[str], ratios: Sequence[float], label_a: str, label_b: str) -> str:
    """Horizontal bars: per kernel, the geometric-mean time ratio B / A (below 1: B is faster)."""
    colors = ["#16a34a" if r < 0.97 else "#dc2626" if r > 1.03 else "#94a3b8" for r in ratios]
    trace: Trace = {
        "type": "bar",
        "orientation": "h",
        "y": list(kernels),
        "x": list(ratios),
        "name": "time ratio",
        "marker": {"color": colors},
        "hovertemplate": "%{y}: "
        + f"{label_b} takes "
        + "%{x:.3f}× "
        + f"the time of {label_a}<extra></extra>",
    }
    line = {
        "type": "line",
        "yref": "paper",
        "y0": 0,
        "y1": 1,
        "x0": 1,
        "x1": 1,
        "line": {"color": "#334155", "width": 1},
    }
    return _json(
        [trace],
        _layout(
            height=max(180, 70 + 28 * len(kernels)),
            shapes=[line],
            x_title=f"time on {label_b}<br>/ time on {label_a} (geometric mean)",  # 2 lines: fits 390 px
            yaxis={"autorange": "reversed", "type": "category"},
        ),
    )


def results_per_day_figure(
    days: Sequence[str], workers: Sequence[str], counts: dict[tuple[str, str], int]
) -> str:
    """Stacked bars: results stored per day, one trace per worker."""
    data: list[Trace] = [
        {
            "type": "bar",
            "x": list(days),
            "y": [counts.get((w, d), 0) for d in days],
            "name": w,
            "marker": {"color": PALETTE[i % len(PALETTE)]},
            "hovertemplate": f"{w}<br>" + "%{x}: %{y} results<extra></extra>",
        }
        for i, w in enumerate(workers)
    ]
    return _json(data, _layout(height=240, y_title="results", barmode="stack", xaxis={"type": "category"}))


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def samples_figure(trials: Sequence[tuple[str, Sequence[float]]]) -> str:
    """Box plots of the raw per-launch samples of a run's fastest trials (one trace per config),
    horizontal: the config names sit one per row on the y axis, so long names never overlap."""
    div, unit = time_unit([max(s) for _, s in trials if s])
    data: list[Trace] = [
        {
            "type": "box",
            "name": key,
            "x": _scaled(list(samples), div),
            "orientation": "h",
            "boxpoints": False,
            "marker": {"color": "#64748b" if key == "builtin" else PALETTE[i % len(PALETTE)]},
            "hovertemplate": f"{key}<br>" + "%{x:.2f} " + f"{unit}<extra></extra>",
        }
        for i, (key, samples) in enumerate(trials)
    ]
    return _json(
        data,
        _layout(height=80 + 30 * len(trials), x_title=f"time per launch ({unit})", showlegend=False,
                yaxis={"type": "category", "autorange": "reversed"}, margin={"l": 16}),
    )
