"""Download links for a page's data: ``GET /api/v1/results`` with the page's filters, as CSV and JSON
(one page of up to :data:`LIMIT` runs, newest first; the response names the next page)."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlencode

LIMIT = 5000  # the results API's largest page


def result_links(**filters: str | Sequence[str] | None) -> dict[str, str]:
    """``{"csv": url, "json": url}`` for the runs matching ``filters`` (None or empty: no filter)."""
    params: list[tuple[str, str]] = []
    for name, value in filters.items():
        values = [value] if isinstance(value, str) else list(value or ())
        params += [(name, v) for v in values if v]
    params.append(("limit", str(LIMIT)))
    return {fmt: "/api/v1/results?" + urlencode([*params, ("format", fmt)]) for fmt in ("csv", "json")}
