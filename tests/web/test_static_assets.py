"""plotly.js is served from a content-hashed URL, gzip-compressed, with a year-long immutable cache."""

from __future__ import annotations

import re

import httpx
from conftest import Coordinator

from kernelfleet.web.plotly_styles import PLOTLY_JS
from kernelfleet.web.static_files import plotly_url


def test_plotly_is_gzipped_hashed_and_immutable(coordinator: Coordinator) -> None:
    url = plotly_url()  # what the chart pages name (the browser tests check they load it)
    assert re.fullmatch(r"/static/plotly-[0-9a-f]{12}\.min\.js", url)
    raw = PLOTLY_JS.read_bytes()
    with httpx.Client(base_url=coordinator.url) as http:
        r = http.get(url, headers={"Accept-Encoding": "gzip, deflate, br"})
        assert r.status_code == 200
        assert r.headers["content-encoding"] == "gzip"
        assert r.headers["content-type"].startswith("text/javascript")
        cache = r.headers["cache-control"]
        assert "immutable" in cache and int(re.search(r"max-age=(\d+)", cache).group(1)) >= 31536000
        assert "accept-encoding" in r.headers["vary"].lower()
        wire = int(r.headers["content-length"])
        assert wire < len(raw) / 3, (wire, len(raw))  # 4.8 MB -> ~1.5 MB
        assert r.content == raw  # httpx decoded the gzip body: the very file plotly ships

        plain = http.get(url, headers={"Accept-Encoding": "identity"})
        assert plain.status_code == 200 and "content-encoding" not in plain.headers
        assert plain.content == raw

        legacy = http.get("/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
        assert legacy.status_code == 200 and legacy.headers["content-encoding"] == "gzip"
        assert "immutable" not in legacy.headers["cache-control"]
        assert legacy.content == raw

        assert http.get("/static/plotly-000000000000.min.js").status_code == 404
