"""Screenshots for the README (docs/dashboard-*.png) of a synthetic 60-day fleet history.

Not a test: run ``python tests/web/docs_screenshots.py [--out docs]``. The history comes from the
dashboard benchmark's generator (benchmarks/dashboard.py) at a smaller scale, because data posted
through the API in a test all carries the same minute and makes flat-looking time axes; the pages
are the real pages of a real ``kernelfleet serve`` in headless Chromium.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "benchmarks")]

from browser import launch, open_page  # noqa: E402
from dashboard import generate, serve  # noqa: E402

from kernelfleet.service.db import make_engine  # noqa: E402
from kernelfleet.service.migrate import upgrade  # noqa: E402

SHOTS = {
    "dashboard-fleet.png": ("/", 1360, 1000),
    "dashboard-chip.png": ("/chips/Apple%20M3%20Max?kernel=rmsnorm&dtype=float16&runs=40", 1360, 1500),
    "dashboard-kernel.png": ("/kernels/softmax?dtype=float16", 1360, 1250),
    "dashboard-regressions.png": ("/regressions?kernel=rmsnorm&chip=Apple+M3+Max", 1360, 1150),
    "dashboard-compare.png": (f"/compare?chip={quote('Apple M3 Max')}&mlx_a=0.32.3&mlx_b=0.32.4", 1360, 1100),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE.parents[1] / "docs"))
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kf-docs-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'docs.db'}"
        upgrade(url)
        engine = make_engine(url)
        generate(engine, args.runs, 6, days=60)
        engine.dispose()
        proc, base = serve(url, Path(tmp))
        try:
            for browser in launch():
                for name, (path, width, height) in SHOTS.items():
                    page = open_page(browser, base + path, width=width)
                    assert page.status == 200 and not page.errors, (path, page.status, page.errors)
                    page.page.set_viewport_size({"width": width, "height": height})
                    page.page.screenshot(path=str(out / name))
                    page.page.close()
                    print("wrote", out / name)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
