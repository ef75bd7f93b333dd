"""Every dashboard page in headless Chromium, on a coordinator filled through its real API
(SQLite, and PostgreSQL when KERNELFLEET_TEST_POSTGRES_URL is set).

Expected values come from the reports the fixture posted (tests/web/filled.py), never from the
dashboard's own queries."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlparse

import httpx
import pytest
from browser import Opened, launch, open_page, shoot_for_docs, wait_for_charts
from conftest import BACKENDS, MigratedTemplates
from filled import CHIPS, DRIFT, DTYPES, KERNELS, SHAPES, Filled, filled_coordinator

pytestmark = [pytest.mark.browser, pytest.mark.slow]

M3, H100, M2 = "Apple M3 Max", "NVIDIA H100 80GB HBM3", "Apple M2"


@pytest.fixture(scope="module", params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         migrated_templates: MigratedTemplates) -> Iterator[Filled]:
    if request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
    yield from filled_coordinator(request.param, tmp_path_factory.mktemp(f"site-{request.param}"),
                                  migrated_templates)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()


def visit(browser: Any, site: Filled, path: str, docs_name: str | None = None) -> Opened:
    """The page at ``path``, answered 200; saved as ``docs_name`` for the README when
    $KERNELFLEET_DOCS_SCREENSHOTS names a folder."""
    opened = open_page(browser, site.url + path)
    assert opened.status == 200, f"{path}: HTTP {opened.status}\n{opened.text()[:500]}"
    if docs_name:
        shoot_for_docs(opened, docs_name)
    return opened


def close(opened: Opened) -> None:
    assert opened.errors == [], opened.errors
    opened.page.close()


def trace(traces: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [t for t in traces if t["name"] == name]
    assert found, f"no trace {name!r} in {[t['name'] for t in traces]}"
    return found[0]


def test_fleet_lists_workers_status_current_job_and_results_per_day(
    browser: Any, site: Filled
) -> None:
    page = visit(browser, site, "/", docs_name="dashboard-fleet.png")
    rows = {r[0].split(" #")[0]: r for r in page.rows("workers")}
    assert set(rows) == set(site.workers)
    for name, w in site.workers.items():
        assert rows[name][1] == w["chip"]
    for name in ("studio-m3max", "gpu-h100-a", "mini-m2"):
        assert rows[name][3] == "online"
    assert rows["old-m1"][3] == "revoked"
    current = rows["gpu-h100-a"][5]
    assert "rope 32x1x128 float16" in current or "rope 32x8x128 float16" in current
    assert f"job {site.leased_job}" in rows["gpu-h100-a"][5]
    assert rows["studio-m3max"][5] == "idle"
    per_worker = {
        name: sum(1 for p in site.posted if p.chip == w["chip"]) for name, w in site.workers.items()
    }
    for name in ("studio-m3max", "gpu-h100-a", "mini-m2"):
        assert rows[name][6] == str(per_worker[name])
    traces = page.charts()["results-per-day"]
    for name in ("studio-m3max", "gpu-h100-a", "mini-m2"):
        t = trace(traces, f"{name} (#{site.workers[name]['id']})")
        assert sum(t["y"]) == per_worker[name]
    # the status filter lives in the URL
    page.page.select_option("select[name=status]", "revoked")
    page.page.click("form.filters button[type=submit]")
    page.page.wait_for_load_state("load")
    assert parse_qs(urlparse(page.page.url).query)["status"] == ["revoked"]
    assert [r[0].split(" #")[0] for r in page.rows("workers")] == ["old-m1"]
    # the chip link of a worker opens its chip page
    page.page.goto(site.url + "/?status=online")
    page.page.click("table#workers tr[data-worker='mini-m2'] a[href^='/chips/']")
    page.page.wait_for_load_state("load")
    assert urlparse(page.page.url).path == "/chips/" + quote(M2, safe="")
    close(page)


def test_chip_page_charts_series_per_kernel_and_shape(browser: Any, site: Filled) -> None:
    page = visit(browser, site, "/chips/" + quote(M3, safe=""), docs_name="dashboard-chip.png")
    tabs = page.page.eval_on_selector_all(
        "#kernel-tabs a", "as => as.map(a => a.firstChild.textContent.trim())"
    )
    assert tabs == sorted(KERNELS)
    charts = page.charts()
    assert set(charts) == {f"rmsnorm {s}" for s in SHAPES}  # the first kernel by default
    for shape in SHAPES:
        traces = charts[f"rmsnorm {shape}"]
        runs = [p for p in site.posted if (p.chip, p.kernel, p.shape) == (M3, "rmsnorm", shape)]
        for dtype in DTYPES:
            line = trace(traces, dtype)
            expected = [p.best["median_us"] for p in runs if p.dtype == dtype]
            assert line["y"] == pytest.approx(expected)  # oldest first
            band = trace(traces, f"{dtype} p10–p90")
            assert band["y"] == pytest.approx([p.best["p10_us"] for p in runs if p.dtype == dtype])
        for mlx in ("0.32.3", "0.32.4"):
            markers = trace(traces, f"MLX {mlx}")
            assert sorted(markers["y"]) == pytest.approx(
                sorted(p.best["median_us"] for p in runs if p.mlx == mlx)
            )
            assert {c[0] for c in markers["customdata"]} == {p.result_id for p in runs if p.mlx == mlx}
    # best config per shape and speedup: the latest run of each series
    latest = {k: p for k, p in site.latest().items() if k[0] == M3 and k[1] == "rmsnorm"}  # the kernel shown
    table = page.page.eval_on_selector_all(
        "table#best-configs tbody tr",
        "rs => rs.map(r => [r.dataset.kernel, r.dataset.shape, r.dataset.dtype, r.dataset.config,"
        " r.cells[6].innerText])",
    )
    assert len(table) == len(latest) == len(SHAPES) * len(DTYPES)
    for kernel, shape, dtype, config, speedup in table:
        p = latest[(M3, kernel, shape, dtype)]
        assert config == p.report["best_config_key"]
        assert speedup == f"{p.builtin['median_us'] / p.best['median_us']:.2f}×"
    # the kernel tab is a shareable filter
    page.page.click("#kernel-tabs a:has-text('softmax')")
    page.page.wait_for_load_state("load")
    wait_for_charts(page.page)
    assert parse_qs(urlparse(page.page.url).query)["kernel"] == ["softmax"]
    assert set(page.charts()) == {f"softmax {s}" for s in SHAPES}
    # the dtype filter keeps the kernel and drops the other dtype's series
    page.page.select_option("select[name=dtype]", "float32")
    page.page.click("form.filters button[type=submit]")
    page.page.wait_for_load_state("load")
    wait_for_charts(page.page)
    query = parse_qs(urlparse(page.page.url).query)
    assert query["kernel"] == ["softmax"] and query["dtype"] == ["float32"]
    for traces in page.charts().values():
        assert {t["name"] for t in traces if not t["name"].startswith("MLX")} == {
            "float32",
            "float32 p90",
            "float32 p10–p90",
        }
    close(page)


def test_kernel_page_side_by_side_heatmap_and_golden_drift(browser: Any, site: Filled) -> None:
    latest = site.latest()
    page = visit(browser, site, "/kernels/softmax", docs_name="dashboard-kernel.png")
    head = page.page.eval_on_selector_all(
        "table#side-by-side thead tr:first-child th[colspan]", "ths => ths.map(t => t.innerText.trim())"
    )
    assert head == sorted(CHIPS)
    rows = page.rows("side-by-side")
    assert len(rows) == len(SHAPES) * len(DTYPES)
    for row in rows:
        shape, dtype = row[0], row[1]
        for i, chip in enumerate(sorted(CHIPS)):
            p = latest[(chip, "softmax", shape, dtype)]
            assert row[3 + 2 * i] == f"{p.builtin['median_us'] / p.best['median_us']:.2f}×"
    charts = page.charts()
    heat = charts["best-config"][0]
    assert heat["type"] == "heatmap" and heat["y"] == sorted(CHIPS)
    for i, chip in enumerate(heat["y"]):
        for j, shape in enumerate(heat["x"]):
            assert heat["text"][i][j] == latest[(chip, "softmax", shape, "float16")].report["best_config_key"]
    for chip in CHIPS:
        bars = trace(charts["speedup"], chip)
        expected = [latest[(chip, "softmax", s, "float16")] for s in bars["x"]]
        assert bars["y"] == pytest.approx([p.builtin["median_us"] / p.best["median_us"] for p in expected])
    # golden drift: only the H100's softmax 4096x4096 float16 output is off, against both other chips
    verdicts = page.page.eval_on_selector_all(
        "table#golden-drift tbody tr",
        "rs => rs.map(r => [r.dataset.shape, r.dataset.dtype, r.cells[2].innerText, r.dataset.verdict])",
    )
    assert len(verdicts) == len(SHAPES) * len(DTYPES) * 3  # three chip pairs per shape and dtype
    flagged = [(s, d, pair) for s, d, pair, v in verdicts if v == "drift"]
    assert len(flagged) == 2 and all((s, d) == DRIFT[2:] and DRIFT[0] in pair for s, d, pair in flagged)
    assert all(v in ("identical", "within") for s, d, pair, v in verdicts if (s, d, pair) not in flagged)
    assert page.page.is_visible("#drift-banner")
    close(page)
    page = visit(browser, site, "/kernels/rmsnorm?dtype=float32")
    assert not page.page.is_visible("#drift-banner")
    assert {r[1] for r in page.rows("side-by-side")} == {"float32"}
    close(page)


def test_compare_two_chips_and_two_mlx_versions(browser: Any, site: Filled) -> None:
    latest = site.latest()
    page = visit(
        browser, site, f"/compare?a={quote(M3)}&b={quote(H100)}", docs_name="dashboard-compare.png"
    )
    pairs = page.page.eval_on_selector_all(
        "table#compare-table tbody tr[data-shape]",
        "rs => rs.map(r => [r.dataset.kernel, r.dataset.shape, r.dataset.dtype, r.cells[5].innerText])",
    )
    assert len(pairs) == len(KERNELS) * len(SHAPES) * len(DTYPES)
    for kernel, shape, dtype, ratio in pairs:
        a, b = latest[(M3, kernel, shape, dtype)], latest[(H100, kernel, shape, dtype)]
        assert float(ratio) == pytest.approx(b.best["median_us"] / a.best["median_us"], abs=1e-3)
    bars = page.charts()["compare-ratio"][0]
    assert bars["y"] == sorted(KERNELS) and all(r < 1 for r in bars["x"])  # the H100 is faster everywhere
    close(page)
    # two MLX versions on one chip: the choice is made through the form, and the URL carries it
    page = visit(browser, site, f"/compare?chip={quote(M3)}")
    page.page.select_option("select[name=mlx_a]", "0.32.3")
    page.page.select_option("select[name=mlx_b]", "0.32.4")
    page.page.click("#compare-versions button[type=submit]")
    page.page.wait_for_load_state("load")
    wait_for_charts(page.page)
    query = parse_qs(urlparse(page.page.url).query)
    assert query["mlx_a"] == ["0.32.3"] and query["mlx_b"] == ["0.32.4"] and query["chip"] == [M3]
    old = {(p.kernel, p.shape, p.dtype): p for p in site.posted if p.chip == M3 and p.mlx == "0.32.3"}
    new = {(p.kernel, p.shape, p.dtype): p for p in site.posted if p.chip == M3 and p.mlx == "0.32.4"}
    pairs = page.page.eval_on_selector_all(
        "table#compare-table tbody tr[data-shape]",
        "rs => rs.map(r => [r.dataset.kernel, r.dataset.shape, r.dataset.dtype, r.cells[5].innerText])",
    )
    assert len(pairs) == len(old)
    for kernel, shape, dtype, ratio in pairs:
        key = (kernel, shape, dtype)
        assert float(ratio) == pytest.approx(
            new[key].best["median_us"] / old[key].best["median_us"], abs=1e-3
        )
    regressed = [float(r) for k, s, d, r in pairs if (k, s) == ("rmsnorm", "4096x4096")]
    assert all(r > 1.1 for r in regressed)  # the 15% slowdown MLX 0.32.4 brought
    close(page)


def test_regressions_list_evidence_and_attribution(browser: Any, site: Filled) -> None:
    page = visit(browser, site, "/regressions", docs_name="dashboard-regressions.png")
    ids = [
        int(i)
        for i in page.page.eval_on_selector_all("article.regression", "as => as.map(a => a.dataset.id)")
    ]
    assert site.regressions["m3"] in ids and site.regressions["m2"] in ids
    assert site.regressions["h100"] not in ids  # acknowledged: not active
    charts = page.charts()
    sizes = set()
    for label, chip in (("m3", M3), ("m2", M2)):
        rid = site.regressions[label]
        card = page.page.locator(f"#regression-{rid}")
        assert "mlx_version: 0.32.3 → 0.32.4" in card.inner_text()
        # the cause's group: the Apple chips' series MLX 0.32.4 slowed (both dtypes, as detected)
        same = re.search(r"(\d+) regressions on 2 chips", card.inner_text())
        assert same is not None, card.inner_text()
        sizes.add(int(same.group(1)))
        traces = charts[f"evidence-{rid}"]
        series = [
            p
            for p in site.posted
            if (p.chip, p.kernel, p.shape, p.dtype) == (chip, "rmsnorm", "4096x4096", "float16")
        ]
        assert trace(traces, "float16")["y"] == pytest.approx([p.best["median_us"] for p in series])
        flagged = trace(traces, "flagged run")
        assert len(flagged["y"]) == 2  # the baseline run and the regressed run
        assert {c[0] for c in trace(traces, "MLX 0.32.4")["customdata"]} == {
            p.result_id for p in series if p.mlx == "0.32.4"
        }
    # the "same cause" link filters by group, in the URL
    assert len(sizes) == 1 and sizes.pop() >= 2
    page.page.click(f"#regression-{site.regressions['m3']} a:has-text('regressions on 2 chips')")
    page.page.wait_for_load_state("load")
    wait_for_charts(page.page)
    assert parse_qs(urlparse(page.page.url).query)["group"] == ["mlx_version=0.32.3->0.32.4"]
    group_ids = page.page.eval_on_selector_all("article.regression", "as => as.map(a => +a.dataset.id)")
    assert site.regressions["m3"] in group_ids and site.regressions["m2"] in group_ids
    link = page.page.locator(f"#regression-{site.regressions['m3']} a:has-text('regressions on 2 chips')")
    assert link.inner_text().startswith(f"{len(group_ids)} regressions")
    close(page)
    page = visit(browser, site, "/regressions?status=acknowledged")
    card = page.page.locator(f"#regression-{site.regressions['h100']}")
    assert "thermal throttling on that host" in card.inner_text()
    assert "no attribute changed" in card.inner_text()
    assert page.page.locator("form.ack").count() == 0
    close(page)


def test_campaigns_progress_states_and_failures(browser: Any, site: Filled) -> None:
    page = visit(browser, site, "/campaigns", docs_name="dashboard-campaigns.png")
    rows = {r[1]: r for r in page.rows("campaigns")}
    assert set(rows) == set(site.campaigns)
    for name in site.campaigns:
        if name.startswith("round"):
            assert rows[name][5] == "8 / 8", rows[name]
    assert rows["layernorm bf16 on M2"][5] == "0 / 1" and rows["layernorm bf16 on M2"][6] == "1"
    assert rows["rope on H100"][5] == "0 / 2"
    page.page.click("table#campaigns a:has-text('layernorm bf16 on M2')")
    page.page.wait_for_load_state("load")
    failures = {int(r[0]): r for r in page.rows("failures")}
    assert failures[site.dead_job][4] == "dead" and failures[site.dead_job][6] == site.dead_error
    close(page)
    page = visit(browser, site, f"/campaigns/{site.campaigns['rope on H100']}")
    counts = dict(
        page.page.eval_on_selector_all(
            "#state-counts a", "as => as.map(a => [a.dataset.state, +a.querySelector('b').innerText])"
        )
    )
    assert counts == {"queued": 1, "leased": 1, "done": 0, "dead": 0, "cancelled": 0}
    page.page.click("#state-counts a[data-state=leased]")
    page.page.wait_for_load_state("load")
    assert parse_qs(urlparse(page.page.url).query)["state"] == ["leased"]
    jobs = page.rows("jobs")
    assert [int(r[0]) for r in jobs] == [site.leased_job] and jobs[0][7] == "gpu-h100-a"
    close(page)


def test_profiles_show_pull_commands(browser: Any, site: Filled) -> None:
    page = visit(browser, site, "/profiles", docs_name="dashboard-profiles.png")
    listed = {}
    for table in ("profiles", "no-profile"):
        if page.page.locator(f"table#{table}").count():
            for chip, cmd in page.page.eval_on_selector_all(
                f"table#{table} tbody tr",
                "rs => rs.map(r => [r.dataset.chip, r.querySelector('code.pull').innerText])",
            ):
                listed[chip] = cmd
    assert set(listed) == set(CHIPS)  # every chip with results, with or without a profile
    for chip, cmd in listed.items():  # the last row of each chip: chip-wide, or one MLX version's
        words = shlex.split(cmd)
        assert words[:6] == ["kernelfleet", "pull", "--coordinator", site.url, "--chip", chip]
        assert words[6:] in ([], ["--mlx-version", words[-1]])
    close(page)


def test_run_page_lists_every_trial(browser: Any, site: Filled) -> None:
    p = site.latest()[(H100, "rmsnorm", "4096x4096", "float16")]
    page = visit(browser, site, "/kernels/rmsnorm")
    page.page.click(f"a[href='/runs/{p.result_id}']")
    page.page.wait_for_load_state("load")
    wait_for_charts(page.page)
    statuses = dict(zip(page.rows("trials", "data-config"), page.rows("trials", "data-status"), strict=True))
    assert statuses == {t["config_key"]: t["status"] for t in p.report["trials"]}
    boxes = page.charts()["samples"]
    assert boxes[0]["name"] == p.report["best_config_key"]
    assert sorted(boxes[0]["x"]) == pytest.approx(p.best["samples_us"])
    close(page)


def test_every_link_on_every_page_answers(site: Filled) -> None:
    import re

    pages = [
        "/",
        "/chips",
        "/kernels",
        "/compare",
        "/regressions",
        "/regressions?status=all",
        "/campaigns",
        "/profiles",
        "/chips/" + quote(M3, safe=""),
        "/kernels/rmsnorm",
        f"/compare?a={quote(M3)}&b={quote(M2)}",
    ]
    seen: set[str] = set()
    with httpx.Client(base_url=site.url, timeout=30) as client:
        for path in pages:
            html = client.get(path).text
            for href in re.findall(r'href="(/[^"#]*)"', html):
                href = href.replace("&amp;", "&")
                if href in seen or href.startswith("/static/"):
                    continue
                seen.add(href)
                r = client.get(href)
                assert r.status_code == 200, f"{href} (linked from {path}): {r.status_code}"
    assert len(seen) > 40


def test_friendly_errors_for_unknown_ids_and_bad_filters(browser: Any, site: Filled) -> None:
    cases = [
        ("/chips/Apple%20M9%20Ultra", 404, "no chip called 'Apple M9 Ultra'"),
        ("/kernels/flash_attention", 404, "no results for a kernel called 'flash_attention'"),
        ("/campaigns/999999", 404, "no campaign with id 999999"),
        ("/regressions/999999", 404, "no regression with id 999999"),
        ("/runs/999999", 404, "no run with id 999999"),
        ("/campaigns/abc", 422, "campaign_id"),
        ("/?days=0", 422, "days"),
        ("/?status=sleeping", 422, "status"),
        ("/regressions?status=bogus", 422, "status"),
        (f"/compare?a={quote(M3)}", 400, "needs both a and b"),
        (f"/compare?a={quote(M3)}&b={quote(M3)}", 400, "the same chip"),
        (
            f"/compare?chip={quote(M3)}&mlx_a=0.32.3&mlx_b=9.9.9",
            404,
            "no results on Apple M3 Max with MLX 9.9.9",
        ),
        (f"/chips/{quote(M3, safe='')}?kernel=nope", 404, "no results for kernel 'nope'"),
        (f"/chips/{quote(M3, safe='')}?runs=5000", 422, "runs"),
    ]
    for path, status, message in cases:
        page = open_page(browser, site.url + path)
        assert page.status == status, path
        text = page.text()
        assert message in text, (path, text)
        assert "Traceback" not in text
        assert page.page.locator("a[href='/']").count() > 0  # a way back
        page.page.close()


def test_acknowledge_needs_the_admin_token(browser: Any, site: Filled) -> None:
    rid = site.regressions["m2"]
    page = visit(browser, site, f"/regressions/{rid}")
    form = page.page.locator("form.ack")
    form.locator("input[name=note]").fill("known: MLX 0.32.4 rms_norm change, tracked upstream")
    form.locator("input[name=token]").fill(site.workers["mini-m2"]["token"])  # a worker token is refused
    form.locator("button").click()
    page.page.wait_for_selector(".ack-result.bad")
    assert "admin token" in form.locator(".ack-result").inner_text()
    form.locator("input[name=token]").fill("wrong-token")
    form.locator("button").click()
    page.page.wait_for_function("() => document.querySelector('.ack-result').innerText.includes('invalid')")
    with httpx.Client(base_url=site.url, timeout=30) as client:
        assert client.post(f"/api/v1/regressions/{rid}/acknowledge", json={}).status_code == 401
        assert client.get(f"/regressions/{rid}").text.count('data-status="open"') == 1  # nothing changed
    form.locator("input[name=token]").fill(site.coordinator.admin_token)
    with page.page.expect_navigation():
        form.locator("button").click()
    wait_for_charts(page.page)
    card = page.page.locator(f"#regression-{rid}")
    assert card.get_attribute("data-status") == "acknowledged"
    assert "known: MLX 0.32.4 rms_norm change" in card.inner_text()
    assert page.page.locator("form.ack").count() == 0
    # the browser's console saw the refused attempts (401/403 responses); nothing else failed
    assert all("401" in e or "403" in e for e in page.errors), page.errors
    page.page.close()
    with httpx.Client(base_url=site.url, timeout=30) as client:
        again = client.post(
            f"/api/v1/regressions/{rid}/acknowledge",
            json={},
            headers={"Authorization": f"Bearer {site.coordinator.admin_token}"},
        )
        assert again.status_code == 409 and "acknowledged" in again.json()["detail"]
