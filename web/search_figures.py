"""Search-space figures for the run page: why a config wins.

- :func:`param_figure`: the median time of every measured config against one parameter's values
  (one chart per parameter: threadgroup size, vector width, rows per group, ...), the fastest at each
  value joined by a line, the built-in as a dashed line;
- :func:`bandwidth_figure`: the achieved memory bandwidth of the fastest configs (the kernel's
  minimum bytes moved, ``KernelSpec.bytes_moved``, over the median time) against the chip's
  published bandwidth (``kernelfleet.chips``), so "how close to the roof" reads at a glance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.kernels.spec import parse_config_key
from kernelfleet.web.figures import PALETTE, Trace, _json, _layout, _scaled, time_unit

BANDWIDTH_BARS = 20


@dataclass(frozen=True)
class Measured:
    """One successful trial of a run."""

    config_key: str
    median_us: float


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def parameters(trials: Sequence[Measured]) -> list[str]:
    """The parameter names the run's custom configs vary (a parameter with one value explains nothing)."""
    values: dict[str, set[str]] = {}
    for t in trials:
        if t.config_key != "builtin":
            for k, v in parse_config_key(t.config_key).items():
                values.setdefault(k, set()).add(str(v))
    return sorted(k for k, vs in values.items() if len(vs) > 1)


def param_figure(trials: Sequence[Measured], param: str, builtin_us: float | None) -> str:
    """Median time against ``param``: a marker per config (hover: the whole config), a line through
    the fastest config at each value (trace ``"fastest"``), the built-in dashed."""
    custom = [(parse_config_key(t.config_key), t) for t in trials if t.config_key != "builtin"]
    custom = [(c, t) for c, t in custom if param in c]
    div, unit = time_unit([t.median_us for _, t in custom] + [builtin_us])
    order = sorted({c[param] for c, _ in custom}, key=_sort_key)
    cats = [str(v) for v in order]
    best = {str(v): min(t.median_us for c, t in custom if c[param] == v) for v in order}
    data: list[Trace] = [
        {
            "type": "scatter",
            "mode": "markers",
            "name": "configs",
            "x": [str(c[param]) for c, _ in custom],
            "y": _scaled([t.median_us for _, t in custom], div),
            "text": [t.config_key for _, t in custom],
            "marker": {"color": PALETTE[0], "size": 7, "opacity": 0.55},
            "hovertemplate": "%{text}<br>%{y:.2f} " + unit + "<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "fastest",
            "x": cats,
            "y": _scaled([best[v] for v in cats], div),
            "line": {"color": PALETTE[1], "width": 2},
            "marker": {"color": PALETTE[1], "size": 8},
            "hovertemplate": f"fastest with {param}=" + "%{x}: %{y:.2f} " + unit + "<extra></extra>",
        },
    ]
    shapes = []
    if builtin_us is not None:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": builtin_us / div,
                       "y1": builtin_us / div, "line": {"dash": "dash", "color": "#64748b", "width": 1}})
    return _json(data, _layout(height=260, x_title=param, y_title=f"median ({unit})", shapes=shapes,
                               xaxis={"type": "category", "categoryorder": "array", "categoryarray": cats}))


def bandwidth_figure(trials: Sequence[Measured], nbytes: int, peak_gbs: float | None, chip: str) -> str:
    """Achieved GB/s of the fastest configs (and the built-in), fastest on top (trace
    ``"achieved"``), with the chip's published bandwidth as a line when the chip table knows it."""
    ranked = sorted(trials, key=lambda t: t.median_us)
    shown = ranked[:BANDWIDTH_BARS]
    shown += [t for t in ranked[BANDWIDTH_BARS:] if t.config_key == "builtin"]
    gbs = [nbytes / (t.median_us * 1e-6) / 1e9 for t in shown]
    colors = ["#64748b" if t.config_key == "builtin" else PALETTE[2] for t in shown]
    of_peak = f" (%{{customdata[0]:.0%}} of {chip}'s {peak_gbs:,.0f} GB/s)" if peak_gbs else ""
    data: list[Trace] = [
        {
            "type": "bar",
            "orientation": "h",
            "name": "achieved",
            "y": [t.config_key for t in shown],
            "x": gbs,
            "customdata": [[g / peak_gbs if peak_gbs else 0.0, t.median_us] for g, t in zip(gbs, shown,
                                                                                               strict=True)],
            "marker": {"color": colors},
            "hovertemplate": "%{y}<br>%{x:,.1f} GB/s" + of_peak + "<extra></extra>",
        }
    ]
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    if peak_gbs:
        shapes.append({"type": "line", "yref": "paper", "y0": 0, "y1": 1, "x0": peak_gbs, "x1": peak_gbs,
                       "line": {"color": "#dc2626", "width": 1.5, "dash": "dot"}})
        notes.append({"yref": "paper", "y": 1, "x": peak_gbs, "xanchor": "right", "yanchor": "bottom",
                      "showarrow": False, "text": f"{chip}: {peak_gbs:,.0f} GB/s",
                      "font": {"size": 10, "color": "#dc2626"}})
    return _json(data, _layout(height=90 + 22 * len(shown), x_title="achieved GB/s (minimum bytes moved)",
                               shapes=shapes, annotations=notes, showlegend=False, margin={"l": 16, "t": 36},
                               yaxis={"type": "category", "autorange": "reversed"}))
