"""Screenshots for the README (docs/dashboard-*.png at 1280 px, docs/dashboard-*-390.png at a phone's
390 px) of a synthetic 60-day fleet history.

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
from sqlalchemy import func, select  # noqa: E402

from kernelfleet.service.db import make_engine  # noqa: E402
from kernelfleet.service.migrate import upgrade  # noqa: E402
from kernelfleet.service.models import Result  # noqa: E402

SHOTS = {  # name -> (path, height at 1280 px)
    "dashboard-fleet": ("/", 1000),
    "dashboard-chip": ("/chips/Apple%20M3%20Max?kernel=rmsnorm&dtype=float16&runs=40", 1500),
    "dashboard-kernel": ("/kernels/softmax?dtype=float16", 1250),
    "dashboard-regressions": ("/regressions?kernel=rmsnorm&chip=Apple+M3+Max", 1150),
    "dashboard-compare": (f"/compare?chip={quote('Apple M3 Max')}&mlx_a=0.32.3&mlx_b=0.32.4", 1100),
    "dashboard-run": ("/runs/{run}", 1900),
}
PHONE = 390
PHONE_MAX_HEIGHT = 2400  # a phone shot shows the top of a long page


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
        with engine.connect() as conn:
            run = conn.scalar(select(func.max(Result.id)).where(Result.chip == "Apple M3 Max",
                                                                Result.kernel == "rmsnorm",
                                                                Result.shape == "4096x4096"))
        engine.dispose()
        proc, base = serve(url, Path(tmp))
        try:
            for browser in launch():
                for name, (path, height) in SHOTS.items():
                    path = path.format(run=run)
                    page = open_page(browser, base + path, width=1280)
                    assert page.status == 200 and not page.errors, (path, page.status, page.errors)
                    page.page.set_viewport_size({"width": 1280, "height": height})
                    page.page.screenshot(path=str(out / f"{name}.png"))
                    page.page.close()
                    phone = open_page(browser, base + path, width=PHONE)
                    tall = min(int(phone.page.evaluate("document.documentElement.scrollHeight")),
                               PHONE_MAX_HEIGHT)
                    phone.page.screenshot(path=str(out / f"{name}-390.png"), full_page=True,
                                          clip={"x": 0, "y": 0, "width": PHONE, "height": tall})
                    phone.page.close()
                    print("wrote", out / f"{name}.png", out / f"{name}-390.png")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
