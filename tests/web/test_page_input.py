"""Dashboard pages and the largest values the database takes: NUL characters and out-of-range ids
get the dashboard's HTML 422 page (not a database error), and the largest offset is answered."""

from __future__ import annotations

import httpx
from conftest import Coordinator


def test_dashboard_refuses_nul_and_huge_ids_with_its_html_page(coordinator: Coordinator) -> None:
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        for path, says in [("/chips/a%00b", "chip: must not contain NUL"),
                           ("/kernels/rms%00norm", "kernel: must not contain NUL"),
                           ("/compare?a=x%00&b=y", "a: must not contain NUL"),
                           ("/runs/2147483648", "less than or equal to 2147483647"),
                           ("/campaigns/9223372036854775808", "less than or equal to 2147483647"),
                           ("/regressions/0", "greater than or equal to 1")]:
            r = http.get(path)
            assert r.status_code == 422, (path, r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("text/html"), path
            assert says in r.text, (path, r.text[:2000])
        assert http.get("/runs/2147483647").status_code == 404  # the largest id is a valid one


def test_largest_offsets_reach_the_database(coordinator: Coordinator) -> None:
    """2**63-1 is the last offset both databases take: an empty page, not an error."""
    with coordinator.admin() as admin:
        for path in ("/jobs", "/campaigns", "/regressions"):
            r = admin.get(path, params={"offset": 2**63 - 1})
            assert r.status_code == 200 and r.json() == [], (path, r.text)
    assert "Traceback" not in coordinator.logs()
