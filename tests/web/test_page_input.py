"""Dashboard pages and bad input: NUL characters, out-of-range ids and malformed filters get the
dashboard's HTML 4xx page in plain words (not pydantic's, not a database error); a filter naming a
value with no data is a 404 naming the values that have some; the largest offset is answered."""

from __future__ import annotations

import httpx
from conftest import Coordinator


def test_dashboard_refuses_nul_and_huge_ids_with_its_html_page(coordinator: Coordinator) -> None:
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        for path, says in [("/chips/a%00b", "chip: must not contain NUL"),
                           ("/kernels/rms%00norm", "kernel: must not contain NUL"),
                           ("/compare?a=x%00&b=y", "a: must not contain NUL"),
                           ("/runs/2147483648", "must be 2147483647 or less"),
                           ("/campaigns/9223372036854775808", "must be 2147483647 or less"),
                           ("/regressions/0", "must be 1 or more"),
                           ("/?days=abc", "days=abc: must be a whole number"),
                           ("/?days=500", "days=500: must be 90 or less"),
                           ("/?status=asleep", "status=asleep: must be one of online, offline, revoked")]:
            r = http.get(path)
            assert r.status_code == 422, (path, r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("text/html"), path
            assert says in r.text, (path, r.text[:2000])
            for pydantic_words in ("Input should", "Value error", "unable to parse", "[type="):
                assert pydantic_words not in r.text, (path, pydantic_words)
        assert http.get("/runs/2147483647").status_code == 404  # the largest id is a valid one


def test_largest_offsets_reach_the_database(coordinator: Coordinator) -> None:
    """2**63-1 is the last offset both databases take: an empty page, not an error."""
    with coordinator.admin() as admin:
        for path in ("/jobs", "/campaigns", "/regressions"):
            r = admin.get(path, params={"offset": 2**63 - 1})
            assert r.status_code == 200 and r.json() == [], (path, r.text)
    assert "Traceback" not in coordinator.logs()


def test_a_chip_filter_without_data_is_a_404_naming_what_has_data(coordinator: Coordinator) -> None:
    """/chips/X?dtype=fp16 was an empty 200 page whose dropdown still said "all"."""
    from filled import one_m2_result

    one_m2_result(coordinator)
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        for query, says in [("dtype=fp16", "with dtype fp16"), ("mlx=9.9", "with MLX version 9.9")]:
            r = http.get("/chips/Apple%20M2?" + query)
            assert r.status_code == 404, (query, r.status_code)
            assert says in r.text and ("float16" in r.text or "0.32.4" in r.text), r.text[:2000]
        ok = http.get("/chips/Apple%20M2?dtype=float16")
        assert ok.status_code == 200 and "<option selected>float16</option>" in ok.text
