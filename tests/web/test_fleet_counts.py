"""The fleet page's counts on both databases (no browser: the HTML and the figure JSON it embeds):
results today include imports, and the per-day chart has imports as a series of their own."""

from __future__ import annotations

import json
import re

import httpx
from conftest import Coordinator
from filled import make_report, one_m2_result


def test_results_today_counts_leased_and_imported_results(coordinator: Coordinator) -> None:
    one_m2_result(coordinator)
    imported = make_report("Apple M2", "softmax", "32x4096", "float16", "0.32.4", 1)
    with coordinator.admin() as admin:
        assert admin.post("/results/import", json={"reports": [imported]}).status_code == 201
    html = httpx.get(coordinator.url + "/?days=2", timeout=30).text
    tile = re.search(r'id="results-today"><b>(\d+)</b><span>([^<]*)', html)
    assert tile and tile.group(1) == "2" and "imports included" in tile.group(2), html[:3000]
    figure = json.loads(re.search(r'<script type="application/json" class="figure">(.*?)</script>',
                                  html, re.S).group(1).replace("<\\/", "</"))
    per_day = {t["name"]: t["y"] for t in figure["data"]}
    assert per_day == {"m2 (#1)": [0, 1], "imported (no worker)": [0, 1]}
    assert "Results (2 d)" in html
    tile_re = r'id="active-regressions"[^>]*><b>0</b><span>regressions active: 0 open, 0 confirming'
    assert re.search(tile_re, html)
