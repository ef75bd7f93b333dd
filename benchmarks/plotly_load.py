"""First-chart load time and plotly.js transfer size of a dashboard chart page, in headless Chromium.

Starts a real ``kernelfleet serve`` on a small synthetic history (benchmarks/dashboard.py's
generator), then opens a chart page in fresh browser contexts: a first visit (empty cache) and a
second visit in the same context (what the cache headers buy). Each is timed from ``goto`` until
every chart on the page is drawn, on the bare loopback and under an emulated network (CDP
``Network.emulateNetworkConditions``: 40 Mbit/s down, 20 ms latency). Prints one line per case
with the bytes transferred for plotly.js (the encoded body size Chromium reports), its
Content-Encoding and Cache-Control.

    python benchmarks/plotly_load.py [--repeat 5] [--label after]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "web")]

from browser import ARGS, CHROMIUM  # noqa: E402
from dashboard import generate, serve  # noqa: E402

from kernelfleet.service.db import make_engine  # noqa: E402
from kernelfleet.service.migrate import upgrade  # noqa: E402

PAGE = "/chips/Apple%20M3%20Max?kernel=rmsnorm&dtype=float16&runs=40"
NETWORK = {"offline": False, "latency": 20, "downloadThroughput": 40e6 / 8, "uploadThroughput": 10e6 / 8}
READY = "() => { const c = document.querySelectorAll('div.chart'); " \
        "return c.length > 0 && Array.from(c).every(d => d.dataset.ready === '1'); }"


def visit(page: Any, url: str) -> tuple[float, dict[str, Any]]:
    seen: dict[str, Any] = {}

    def on_response(resp: Any) -> None:
        if "plotly" in resp.url:
            sizes = resp.request.sizes()
            seen.update(url=resp.url, status=resp.status, body=sizes["responseBodySize"],
                        encoding=resp.headers.get("content-encoding", "identity"),
                        cache=resp.headers.get("cache-control", "-"), cached=resp.status == 304)

    page.on("response", on_response)
    start = time.perf_counter()
    page.goto(url, wait_until="load")
    page.wait_for_function(READY, timeout=60000)
    elapsed = time.perf_counter() - start
    page.remove_listener("response", on_response)
    return elapsed, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="kf-plotly-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        engine = make_engine(url)
        generate(engine, 10, 6, days=14)
        engine.dispose()
        proc, base = serve(url, Path(tmp))
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
                for network in ("loopback", "40 Mbit/s, 20 ms"):
                    first: list[float] = []
                    second: list[float] = []
                    info: dict[str, Any] = {}
                    info2: dict[str, Any] = {}
                    for _ in range(args.repeat):
                        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                        page = ctx.new_page()
                        if network != "loopback":
                            cdp = ctx.new_cdp_session(page)
                            cdp.send("Network.enable")
                            cdp.send("Network.emulateNetworkConditions", NETWORK)
                        t, info = visit(page, base + PAGE)
                        first.append(t)
                        t2, info2 = visit(page, base + PAGE)
                        second.append(t2)
                        ctx.close()
                    again = f"{info2['body']:,} bytes" if info2.get("body", 0) > 0 else "from cache"
                    print(f"{args.label} {network}: first visit median {statistics.median(first):.3f} s "
                          f"(min {min(first):.3f}), plotly.js {info.get('body', 0):,} bytes "
                          f"{info.get('encoding')}, Cache-Control '{info.get('cache')}'; second visit "
                          f"median {statistics.median(second):.3f} s, plotly.js {again} "
                          f"[{args.repeat} runs]", flush=True)
                browser.close()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
