"""Jinja2 environment, template filters and the helpers every page uses (database clock, paging)."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelfleet.runtime_settings_file import JOB_KERNEL as RUNTIME_SETTINGS_KERNEL
from kernelfleet.service.db import db_now
from kernelfleet.web.static_files import plotly_url

TEMPLATES_DIR = Path(__file__).parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))

NAV = [
    ("/", "Fleet"),
    ("/chips", "Chips"),
    ("/kernels", "Kernels"),
    ("/compare", "Compare"),
    ("/regressions", "Regressions"),
    ("/campaigns", "Campaigns"),
    ("/profiles", "Profiles"),
]


def utc(value: datetime | None) -> datetime | None:
    """Aware UTC datetime; SQLite hands back naive UTC values."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def db_clock(session: Session) -> datetime:
    """Now, by the database clock (the coordinator never trusts its own)."""
    now = utc(session.scalar(select(db_now())))
    assert now is not None
    return now


def fmt_time(value: datetime | None) -> str:
    v = utc(value)
    return "—" if v is None else v.strftime("%Y-%m-%d %H:%M UTC")


def fmt_age(value: datetime | None, now: datetime) -> str:
    v = utc(value)
    if v is None:
        return "never"
    secs = max(0.0, (now - v).total_seconds())
    if secs < 90:
        return f"{secs:.0f} s ago"
    if secs < 5400:
        return f"{secs / 60:.0f} min ago"
    if secs < 2 * 86400:
        return f"{secs / 3600:.1f} h ago"
    return f"{secs / 86400:.0f} days ago"


def fmt_us(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 10000:
        return f"{value / 1000:,.1f} ms"
    if value >= 100:
        return f"{value:,.0f} µs"
    return f"{value:.2f} µs"


def fmt_speedup(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def speedup_class(value: float | None) -> str:
    if value is None:
        return ""
    if value >= 1.05:
        return "good"
    if value < 0.95:
        return "bad"
    return "even"


def fmt_cause(cause: Any) -> list[str]:
    """A regression's ``cause`` JSON as readable lines: ``mlx_version: 0.32.3 → 0.32.4``."""
    if not isinstance(cause, dict) or not cause:
        return ["no attribute changed between the runs (noise, load or an unknown cause)"]
    lines = []
    for key, value in cause.items():
        if isinstance(value, list | tuple) and len(value) == 2:
            lines.append(f"{key}: {value[0]} → {value[1]}")
        else:
            lines.append(f"{key}: {json.dumps(value) if not isinstance(value, str) else value}")
    return lines


def url_with(request: Request, path: str | None = None, **changes: Any) -> str:
    """The current URL (or ``path``) with some query parameters changed; ``None`` drops one."""
    params = dict(request.query_params)
    for key, value in changes.items():
        if value is None or value == "":
            params.pop(key, None)
        else:
            params[key] = str(value)
    query = urlencode(params)
    return (path or request.url.path) + (f"?{query}" if query else "")


def path_segment(value: object) -> str:
    """A value quoted for use as one URL path segment (chip names have spaces)."""
    return quote(str(value), safe="")


def figure_json(fig_json: str) -> str:
    """Figure JSON safe to place inside ``<script type="application/json">``."""
    return fig_json.replace("</", "<\\/")


templates.env.filters.update(
    time=fmt_time,
    us=fmt_us,
    speedup=fmt_speedup,
    speedup_class=speedup_class,
    shell=shlex.quote,
    seg=path_segment,
    cause_lines=fmt_cause,
    figure_json=figure_json,
)
templates.env.globals.update(nav=NAV, url_with=url_with, age=fmt_age, plotly_url=plotly_url,
                             runtime_settings_kernel=RUNTIME_SETTINGS_KERNEL)


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render a page. ``public_url`` (commands that name the coordinator) comes from the settings,
    never from the request's Host or X-Forwarded-* headers."""
    context.setdefault("title", "KernelFleet")
    context.setdefault("public_url", request.app.state.settings.resolved_public_url)
    return templates.TemplateResponse(request, template, context, status_code=status_code)
