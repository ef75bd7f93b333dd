"""Every dashboard page at 390 px (a phone) and 1280 px, on an empty coordinator and a filled one,
in headless Chromium: the page body never scrolls sideways, every nav link is visible on the dark
header and clickable, no chart sticks out of the viewport, and no HTML shows as text. Then the
fleet page's counts against the pages they link to and what was posted.

One browser and two coordinators (SQLite) for the module; the pages are visited in a loop, so the
whole module costs one fill (tests/web/filled.py) and ~60 page loads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from browser import launch, open_page, shoot
from conftest import MigratedTemplates
from filled import Filled, filled_coordinator, make_report

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTHS = (390, 1280)
M3 = quote("Apple M3 Max")

EMPTY_PAGES = ["/", "/chips", "/kernels", "/compare", "/regressions", "/campaigns", "/profiles", "/login",
               "/workers/add"]
EMPTY_ERRORS = ["/chips/Apple%20M9", "/kernels/rmsnorm", "/runs/7"]  # 404 pages share the layout


def filled_pages(site: Filled) -> list[str]:
    campaign = next(iter(site.campaigns.values()))
    regression = next(iter(site.regressions.values()))
    return [
        "/", "/?status=revoked", "/chips", f"/chips/{M3}",
        "/kernels", "/kernels/rmsnorm", "/kernels/softmax?dtype=float32",
        f"/compare?a={M3}&b={quote('Apple M2')}", f"/compare?chip={M3}&mlx_a=0.32.3&mlx_b=0.32.4",
        "/compare", "/regressions", "/regressions?status=all", "/regressions?status=dismissed",
        f"/regressions/{regression}", "/campaigns", f"/campaigns/{campaign}", "/profiles",
        f"/runs/{site.posted[-1].result_id}",
    ]


LAYOUT_JS = """() => {
  const vw = window.innerWidth, de = document.documentElement;
  const header = document.querySelector('header.top').getBoundingClientRect();
  const links = Array.from(document.querySelectorAll('header.top nav a')).map(a => {
    const r = a.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return {text: a.textContent.trim(), ok: r.width > 0 && r.left >= 0 && r.right <= vw + 0.5
            && r.top >= header.top && r.bottom <= header.bottom + 0.5 && (hit === a || a.contains(hit))};
  });
  const scrolls = el => { for (let e = el.parentElement; e; e = e.parentElement) {
      if (e === document.body) return false;
      const o = getComputedStyle(e).overflowX; if (o === 'auto' || o === 'scroll') return true; }
    return false; };
  const sticking = Array.from(document.querySelectorAll('main *, header *'))
    .filter(e => e.getBoundingClientRect().right > vw + 1 && !scrolls(e))
    .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + (e.textContent || '').slice(0, 40));
  const charts = Array.from(document.querySelectorAll('div.chart'))
    .filter(d => d.getBoundingClientRect().right > vw + 1).map(d => d.dataset.name);
  const text = document.querySelector('main').innerText;
  const tag = /<\\/?(p|a|pre|code|div|span|br|h[1-6]|ul|li|b|strong|em|table)\\b[^<>]*>/g;
  const escaped = text.match(tag) || [];
  return {overflow: Math.max(de.scrollWidth, document.body.scrollWidth) - vw, links, sticking,
          charts, escaped};
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()


@pytest.fixture(scope="module")
def empty_site(tmp_path_factory: pytest.TempPathFactory,
               migrated_templates: MigratedTemplates) -> Iterator[Filled]:
    yield from filled_coordinator("sqlite", tmp_path_factory.mktemp("empty"), migrated_templates, empty=True)


@pytest.fixture(scope="module")
def filled_site(tmp_path_factory: pytest.TempPathFactory,
                migrated_templates: MigratedTemplates) -> Iterator[Filled]:
    yield from filled_coordinator("sqlite", tmp_path_factory.mktemp("filled"), migrated_templates)


def check_pages(browser: Any, base: str, paths: list[str], shots: Path, ok_status: int = 200) -> None:
    problems: list[str] = []
    for width in WIDTHS:
        for path in paths:
            opened = open_page(browser, base + path, width=width)
            found = opened.page.evaluate(LAYOUT_JS)
            before = len(problems)
            where = f"{path} at {width} px"
            if opened.status != ok_status:
                problems.append(f"{where}: HTTP {opened.status}")
            if found["overflow"] > 0:
                problems.append(f"{where}: body scrolls sideways by {found['overflow']} px: "
                                f"{found['sticking']}")
            bad_links = [link["text"] for link in found["links"] if not link["ok"]]
            if bad_links or len(found["links"]) != 7:
                problems.append(f"{where}: nav links hidden or off the header: {bad_links or found['links']}")
            if found["charts"]:
                problems.append(f"{where}: charts wider than the viewport: {found['charts']}")
            if found["escaped"]:
                problems.append(f"{where}: HTML shown as text: {found['escaped'][:3]}")
            errors = [e for e in opened.errors  # an error page's own status shows up as a console error
                      if ok_status == 200 or "Failed to load resource" not in e]
            if errors:
                problems.append(f"{where}: {errors}")
            if len(problems) > before:  # a full-page screenshot of each page that failed, to look at
                problems.append(f"  screenshot: {shoot(opened, shots, f'{width}{path}')}")
            opened.page.close()
    assert not problems, "\n".join(problems)


def test_empty_coordinator_pages_fit_phone_and_desktop(
    browser: Any, empty_site: Filled, tmp_path: Path
) -> None:
    check_pages(browser, empty_site.url, EMPTY_PAGES, tmp_path)
    check_pages(browser, empty_site.url, EMPTY_ERRORS, tmp_path, ok_status=404)


def test_filled_coordinator_pages_fit_phone_and_desktop(
    browser: Any, filled_site: Filled, tmp_path: Path
) -> None:
    check_pages(browser, filled_site.url, filled_pages(filled_site), tmp_path)
    no_data = [f"/chips/{M3}?dtype=fp16", f"/chips/{M3}?mlx=9.9&kernel=rmsnorm"]
    check_pages(browser, filled_site.url, no_data, tmp_path, ok_status=404)


def test_run_page_explains_the_search_space(browser: Any, filled_site: Filled) -> None:
    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.spec import parse_shape

    posted = next(p for p in reversed(filled_site.posted)
                  if (p.chip, p.kernel, p.shape) == ("Apple M3 Max", "rmsnorm", "4096x4096"))
    page = open_page(browser, f"{filled_site.url}/runs/{posted.result_id}", width=390)
    charts = page.charts()
    ok = [t for t in posted.report["trials"] if t["status"] == "ok"]
    for param in ("tg", "vec"):
        configs = next(t for t in charts[f"param {param}"] if t["name"] == "configs")
        assert sorted(configs["text"]) == sorted(t["config_key"] for t in ok if not t["is_builtin"])
    bars = charts["bandwidth"][0]
    nbytes = get_spec("rmsnorm").bytes_moved(parse_shape("4096x4096"), posted.dtype)
    expected = {t["config_key"]: nbytes / (t["median_us"] * 1e-6) / 1e9 for t in ok}
    assert dict(zip(bars["y"], bars["x"], strict=True)) == pytest.approx(expected)
    assert "against Apple M3 Max's 400 GB/s" in page.page.inner_text("#bandwidth h3")
    assert page.errors == []
    page.page.close()


def test_nav_works_at_390_px(browser: Any, filled_site: Filled) -> None:
    """Tapping each nav link on a phone-sized page opens that page."""
    opened = open_page(browser, filled_site.url + "/", width=390)
    page = opened.page
    for label, path in [("Profiles", "/profiles"), ("Campaigns", "/campaigns"), ("Chips", "/chips")]:
        page.click(f"header.top nav a:text-is('{label}')")
        page.wait_for_url(filled_site.url + path)
        assert page.inner_text("h1").startswith(label)
    assert opened.errors == []
    page.close()


def test_fleet_counts_agree_with_the_pages_they_link_to(browser: Any, filled_site: Filled) -> None:
    """Runs last in the module: it imports one more report (on a newer MLX, for the compare check)."""
    report = make_report("Apple M2", "rmsnorm", "32x4096", "float16", "0.32.5", 99)
    with filled_site.coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [report]})
        assert r.status_code == 201, r.text
    filled_site.coordinator.settle()  # the detector's reaction to it, before counting regressions
    fleet = open_page(browser, filled_site.url + "/?days=3")
    today = int(fleet.page.inner_text("#results-today b"))
    assert today == len(filled_site.posted) + 1  # every posted report and the import, all today
    traces = fleet.charts()["results-per-day"]
    assert "imported (no worker)" in [t["name"] for t in traces]
    assert sum(t["y"][-1] for t in traces) == today  # the last bar is the tile
    assert "Results (3 d)" in fleet.page.inner_text("table#workers thead")
    tile = fleet.page.inner_text("#active-regressions")
    fleet.page.close()

    regressions = open_page(browser, filled_site.url + "/regressions")
    tabs = dict(
        (a.split()[0], int(a.split()[1]))
        for a in regressions.page.eval_on_selector_all("#status-tabs a", "as => as.map(a => a.innerText)")
    )
    regressions.page.close()
    assert tile.split()[0] == str(tabs["active"])
    assert f"{tabs['open']} open, {tabs['confirming']} confirming" in tile
    assert tabs["open"] >= 2  # the two the fixture inserted open (tests/web/filled.py)


def test_compare_says_when_chips_ran_different_mlx_versions(browser: Any, filled_site: Filled) -> None:
    """After the import above, M2's newest rmsnorm 32x4096 float16 run is on MLX 0.32.5, M3's on 0.32.4."""
    page = open_page(browser, filled_site.url + f"/compare?a={M3}&b={quote('Apple M2')}")
    note = page.page.inner_text("#mixed-mlx")
    assert note.startswith("1 of ") and "0.32.5" in note, note
    page.page.click("#mixed-mlx a:text-is('Compare on MLX 0.32.4 only')")
    page.page.wait_for_load_state("load")
    assert "mlx=0.32.4" in page.page.url
    assert page.page.query_selector("#mixed-mlx") is None
    assert page.page.eval_on_selector("select[name=mlx]", "s => s.value") == "0.32.4"
    page.page.close()
