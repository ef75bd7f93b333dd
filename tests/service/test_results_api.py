"""``GET /api/v1/results`` through a real coordinator: keyset paging covers every run exactly once,
each filter (several values, time range) returns exactly the matching runs, CSV by ``format=csv``
and by ``Accept``, and bad filters get 422 with a JSON detail."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

from conftest import Coordinator
from coordinator_helpers import make_report

CHIPS = ("Apple M2", "NVIDIA H100 80GB HBM3")


def _reports() -> list[dict[str, Any]]:
    """12 runs: 2 chips x 2 dtypes x 3 shapes, revisions r1/r2, MLX 0.32.3/0.32.4."""
    out = []
    for i, (chip, dtype, shape) in enumerate(
            (c, d, s) for c in CHIPS for d in ("float16", "float32") for s in ("1x4096", "2x4096", "4x4096")):
        report = make_report(shape=shape, dtype=dtype, chip=chip,
                             backend="metal" if chip.startswith("Apple") else "cuda", median=10.0 + i)
        report["env"]["mlx_version"] = "0.32.3" if i % 2 else "0.32.4"
        report["revision"] = "r1" if i < 6 else "r2"
        out.append(report)
    return out


def _import(coordinator: Coordinator, reports: list[dict[str, Any]]) -> list[int]:
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": reports})
    assert r.status_code == 201, r.text
    return list(r.json()["result_ids"])


def test_paging_filters_and_csv(coordinator: Coordinator) -> None:
    reports = _reports()
    ids = _import(coordinator, reports)
    with coordinator.client() as c:
        # keyset paging: pages of 5 give every run once, newest first, then next_cursor None
        seen: list[int] = []
        params: dict[str, Any] = {"limit": 5}
        pages = 0
        while True:
            body = c.get("/results", params=params).json()
            seen += [row["id"] for row in body["items"]]
            pages += 1
            if body["next_cursor"] is None:
                assert body["next"] is None
                break
            assert f"cursor={body['next_cursor']}" in body["next"]
            params["cursor"] = body["next_cursor"]
        assert seen == sorted(ids, reverse=True) and pages == 3

        row = c.get("/results", params={"limit": 1}).json()["items"][0]
        last = reports[-1]
        assert (row["id"], row["chip"], row["revision"], row["dtype"], row["shape"]) == (
            ids[-1], last["env"]["chip"], "r2", last["dtype"], last["shape"])
        assert row["best_median_us"] == last["trials"][1]["median_us"]
        assert abs(row["speedup"] - 1.2) < 1e-9 and row["source"] == "import"

        def matching(**params: Any) -> set[int]:
            r = c.get("/results", params=params)
            assert r.status_code == 200, r.text
            return {row["id"] for row in r.json()["items"]}

        def expect(pred: Any) -> set[int]:
            return {i for i, rep in zip(ids, reports, strict=True) if pred(rep)}

        assert matching(chip="Apple M2") == expect(lambda r: r["env"]["chip"] == "Apple M2")
        assert matching(chip=list(CHIPS)) == set(ids)
        assert matching(dtype="float32", shape=["1x4096", "4x4096"]) == expect(
            lambda r: r["dtype"] == "float32" and r["shape"] in ("1x4096", "4x4096"))
        assert matching(mlx_version="0.32.3") == expect(lambda r: r["env"]["mlx_version"] == "0.32.3")
        assert matching(revision="r2", backend="cuda") == expect(
            lambda r: r["revision"] == "r2" and r["env"]["backend"] == "cuda")
        assert matching(kernel="rmsnorm") == set(ids) and matching(kernel="softmax") == set()
        assert matching(chip="no such chip") == set()

        # time: everything was stored just now
        now = datetime.now(UTC)
        assert matching(since=(now - timedelta(hours=1)).isoformat()) == set(ids)
        assert matching(until=(now - timedelta(hours=1)).isoformat()) == set()
        assert matching(since=(now + timedelta(hours=1)).isoformat()) == set()

        # CSV by format= and by Accept, with the same rows and a next link
        r = c.get("/results", params={"format": "csv", "limit": 5, "chip": "Apple M2"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
        assert "attachment" in r.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(r.text)))
        apple = sorted(expect(lambda r: r["env"]["chip"] == "Apple M2"), reverse=True)
        assert [int(x["id"]) for x in rows] == apple[:5]
        assert rows[0]["chip"] == "Apple M2" and rows[0]["revision"] == "r1" and rows[0]["driver"] == "580.65"
        assert r.headers["x-next-cursor"] == str(apple[4]) and 'rel="next"' in r.headers["link"]
        r2 = c.get("/results", params={"chip": "Apple M2"}, headers={"Accept": "text/csv"})
        assert r2.headers["content-type"].startswith("text/csv")
        assert [int(x["id"]) for x in csv.DictReader(io.StringIO(r2.text))] == apple
        assert "x-next-cursor" not in r2.headers


def test_revision_stored_old_digests_kept_and_bad_filters_422(coordinator: Coordinator) -> None:
    plain = make_report(shape="8x4096")
    with_rev = dict(make_report(shape="16x4096"), revision="0123abcd" * 5 + "-dirty")
    first = _import(coordinator, [plain, with_rev])
    again = _import(coordinator, [plain, with_rev])  # idempotent: the same rows
    assert first == again
    with coordinator.client() as c:
        got = {row["id"]: row["revision"] for row in c.get("/results").json()["items"]}
    assert got == {first[0]: None, first[1]: "0123abcd" * 5 + "-dirty"}
    with coordinator.admin() as admin:
        bad = admin.post("/results/import", json={"reports": [dict(plain, revision="a b")]})
    assert bad.status_code == 422
    with coordinator.client() as c:
        for params in ({"dtype": "fp16"}, {"backend": "rocm"}, {"limit": 0}, {"limit": 5001},
                       {"cursor": 0}, {"since": "yesterday"}, {"format": "xml"}, {"chip": ""},
                       {"chip": "x" * 129}, {"chip": [f"c{i}" for i in range(65)]}):
            r = c.get("/results", params=params)
            assert r.status_code == 422, (params, r.text)
            assert isinstance(r.json()["detail"], str | list), r.text
