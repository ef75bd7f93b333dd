"""Headless Chromium (Debian's, driven by Playwright) for the dashboard tests."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Set to a folder (e.g. docs/) to also save full-size screenshots for the README.
DOCS_DIR = os.environ.get("KERNELFLEET_DOCS_SCREENSHOTS")

CHARTS_JS = """() => Array.from(document.querySelectorAll('div.chart')).map(d => ({
    name: d.dataset.name,
    traces: (d.data || []).map(t => ({name: t.name, type: t.type, x: t.x || null, y: t.y || null,
                                      z: t.z || null, text: t.text || null,
                                      customdata: t.customdata || null}))}))"""


@dataclass
class Opened:
    page: Any
    errors: list[str] = field(default_factory=list)
    status: int = 0

    def charts(self) -> dict[str, list[dict[str, Any]]]:
        return {c["name"]: c["traces"] for c in self.page.evaluate(CHARTS_JS)}

    def rows(self, table_id: str, attr: str | None = None) -> list[Any]:
        """The table's body rows: their text cells, or one data-attribute each."""
        if attr:
            return list(
                self.page.eval_on_selector_all(
                    f"table#{table_id} tbody tr", f"rows => rows.map(r => r.getAttribute('{attr}'))"
                )
            )
        return list(
            self.page.eval_on_selector_all(
                f"table#{table_id} tbody tr",
                "rows => rows.map(r => Array.from(r.cells).map(c => c.innerText.trim()))",
            )
        )

    def text(self) -> str:
        return str(self.page.inner_text("main"))


_profile: str | None = None  # this process's Chromium profile folder, kept for its later launches
_profile_in_use = False


def launch() -> Iterator[Any]:
    """Headless Chromium as one browser context on an on-disk profile (``open_page`` opens each page
    in it with the cookies cleared, as in a fresh context). On disk, Chromium keeps the static files
    in its HTTP cache and V8's compiled code for them: Plotly's 3.5 MB of JavaScript is compiled on
    the first loads only, not on every chart page (4 s a page on a busy 2-core host, 0.7 s with the
    code cached). The profile is kept for the process's later launches (the next module)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    global _profile, _profile_in_use
    own = _profile_in_use  # one Chromium per profile: a launch inside another gets a folder of its own
    if own:
        folder = tempfile.mkdtemp(prefix="kernelfleet-chromium-")
    else:
        if _profile is None:
            _profile = tempfile.mkdtemp(prefix="kernelfleet-chromium-")
            atexit.register(shutil.rmtree, _profile, True)
        folder, _profile_in_use = _profile, True
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(folder, executable_path=CHROMIUM, args=ARGS,
                                                           headless=True)
            try:
                yield context
            finally:
                context.close()
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            _profile_in_use = False


def open_page(browser: Any, url: str, *, width: int = 1360) -> Opened:
    """Open ``url`` in a new page of ``launch()``'s browser context with no cookies (a sign-in on one
    page does not carry over to the next), collecting console errors and page errors, and wait until
    every chart is drawn."""
    browser.clear_cookies()
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    opened = Opened(page)
    page.on("console", lambda m: opened.errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: opened.errors.append(f"pageerror: {e}"))
    response = page.goto(url, wait_until="load")
    opened.status = response.status if response else 0
    wait_for_charts(page)
    return opened


def wait_for_charts(page: Any) -> None:
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('div.chart')).every(d => d.dataset.ready === '1')",
        timeout=30000,
    )


def shoot(opened: Opened, folder: Path, name: str) -> Path:
    """Save a full-page screenshot to ``folder`` (for a failure's report)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    path = folder / f"{safe}.png"
    opened.page.screenshot(path=str(path), full_page=True)
    return path


def shoot_for_docs(opened: Opened, docs_name: str) -> None:
    """Save a full-page screenshot as $KERNELFLEET_DOCS_SCREENSHOTS/``docs_name`` for the README; nothing
    when that is unset (the tests' pages are checked by their assertions, not by pictures nobody reads)."""
    if DOCS_DIR:
        opened.page.screenshot(path=str(Path(DOCS_DIR) / docs_name), full_page=True)
