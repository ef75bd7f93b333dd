"""Profiles through the real coordinator: built from imported results, versioned with an ETag
(``If-None-Match`` -> 304), rebuilt when new results arrive, optionally per MLX version, with
predictions for shapes never tuned on the chip; listed with their freshness."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import numpy as np

A = "Apple M3 Max"
B = "Apple M3 Pro"


def report(chip: str, shape: str, times: dict[str, float], *, mlx: str = "0.32.4") -> dict[str, Any]:
    trials = []
    for key, t in times.items():
        config = (
            {"variant": "builtin"}
            if key == "builtin"
            else {k: int(v) for k, v in (p.split("=") for p in key.split(","))}
        )
        trials.append(
            {
                "config_key": key,
                "config": config,
                "is_builtin": key == "builtin",
                "status": "ok",
                "samples_us": [t * f for f in np.linspace(0.99, 1.01, 11)],
                "median_us": t,
                "p10_us": t * 0.992,
                "p90_us": t * 1.008,
                "n": 11,
                "max_abs_err": 0.0,
                "max_rel_err": 0.0,
            }
        )
    trials.append(
        {
            "config_key": "rpg=1,tg=32,vec=1",
            "config": {"rpg": 1, "tg": 32, "vec": 1},
            "is_builtin": False,
            "status": "mismatch",
            "error": "3 values outside tolerance",
            "samples_us": None,
            "median_us": None,
            "n": 0,
        }
    )
    best = min(times, key=times.__getitem__)
    return {
        "kernel": "rmsnorm",
        "shape": shape,
        "dtype": "float16",
        "seed": 0,
        "strategy": "exhaustive",
        "env": {
            "chip": chip,
            "backend": "metal",
            "mlx_version": mlx,
            "os": "macOS 15.1",
            "kernel_hash": "k1",
        },
        "trials": trials,
        "best_config_key": best,
        "golden": {
            "digest": "b" * 64,
            "stats": {"mean": 0, "std": 1, "min": -1, "max": 1, "abs_mean": 0.5},
            "sample": [0.0],
            "stride": 1,
            "numel": 1,
        },
    }


FAST = "rpg=1,tg=256,vec=4"
SLOW = "rpg=1,tg=128,vec=2"


def test_profiles_etag_versions_and_predictions(coordinator: Any) -> None:
    with coordinator.admin() as admin:
        r = admin.post(
            "/results/import",
            json={
                "reports": [
                    report(A, "4096x4096", {FAST: 40.0, SLOW: 55.0, "builtin": 60.0}),
                    report(A, "1024x4096", {FAST: 12.0, SLOW: 15.0, "builtin": 14.0}),
                    report(B, "2048x4096", {FAST: 30.0, SLOW: 36.0, "builtin": 33.0}),
                ]
            },
        )
        assert r.status_code == 201, r.text
    with coordinator.client() as c:
        r = c.get(f"/profiles/{quote(A)}")
        assert r.status_code == 200, r.text
        etag = r.headers["etag"]
        body = r.json()
        assert body["schema"] == "kernelfleet-profile/1" and body["chip"] == A and body["version"] == 1
        assert etag == f'"{body["etag"]}"' and body["mlx_version"] is None
        entries = {(e["shape"], e["predicted"]): e for e in body["entries"]}
        tuned = entries[("4096x4096", False)]
        assert tuned["config_key"] == FAST and tuned["config"] == {"rpg": 1, "tg": 256, "vec": 4}
        assert tuned["median_us"] == 40.0 and tuned["speedup"] == 60.0 / 40.0 and tuned["runs"] == 1
        # B's shape was never tuned on A: predicted from A's nearby shapes and B's run
        guess = entries[("2048x4096", True)]
        assert guess["config_key"] == FAST and 0 < guess["confidence"] <= 1
        assert {b["chip"] for b in guess["basis"]} == {A, B}
        # a failed (mismatch) trial is never chosen
        assert all(e["config_key"] != "rpg=1,tg=32,vec=1" for e in body["entries"])

        assert c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": etag}).status_code == 304
        assert c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": f'W/{etag}, "x"'}).status_code == 304
        assert c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": '"stale"'}).status_code == 200

        [listed] = [p for p in c.get("/profiles").json() if p["chip"] == A]
        assert (
            listed["version"] == 1 and listed["stale"] is False and listed["entries"] == len(body["entries"])
        )
        assert listed["pull_command"] == f'kernelfleet pull --chip "{A}"'

    # new results: the built-in now wins at 1024x4096 -> stale, then version 2 with a new ETag
    with coordinator.admin() as admin:
        admin.post(
            "/results/import",
            json={"reports": [report(A, "1024x4096", {FAST: 12.0, SLOW: 15.0, "builtin": 6.0})]},
        )
    with coordinator.client() as c:
        [listed] = [p for p in c.get("/profiles").json() if p["chip"] == A]
        assert listed["stale"] is True
        r = c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": etag})
        assert r.status_code == 200 and r.headers["etag"] != etag
        body = r.json()
        assert body["version"] == 2
        small = next(e for e in body["entries"] if e["shape"] == "1024x4096" and not e["predicted"])
        assert small["config_key"] == "builtin" and small["config"] == {"variant": "builtin"}
        assert small["runs"] == 2 and small["speedup"] == 1.0

        # per MLX version: only that version's results
    with coordinator.admin() as admin:
        admin.post(
            "/results/import",
            json={
                "reports": [report(A, "4096x4096", {FAST: 70.0, SLOW: 50.0, "builtin": 65.0}, mlx="0.33.0")]
            },
        )
    with coordinator.client() as c:
        r = c.get(f"/profiles/{quote(A)}", params={"mlx_version": "0.33.0"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["mlx_version"] == "0.33.0" and body["version"] == 1
        [tuned] = [e for e in body["entries"] if not e["predicted"]]
        assert tuned["shape"] == "4096x4096" and tuned["config_key"] == SLOW
        missing = c.get(f"/profiles/{quote(A)}", params={"mlx_version": "9.9.9"})
        assert missing.status_code == 404 and "no profile for chip" in missing.json()["detail"]
        unknown = c.get("/profiles/" + quote("NVIDIA B200"))
        assert unknown.status_code == 404 and "run a tuning campaign" in unknown.json()["detail"]
        chips = {(p["chip"], p["mlx_version"]) for p in c.get("/profiles").json()}
        assert {(A, None), (A, "0.33.0")} <= chips


def test_profiles_private_when_dashboard_is_not_public(coordinator_factory: Any) -> None:
    coordinator = coordinator_factory(KERNELFLEET_DASHBOARD_PUBLIC="false")
    with coordinator.admin() as admin:
        admin.post(
            "/results/import", json={"reports": [report(A, "4096x4096", {FAST: 40.0, "builtin": 60.0})]}
        )
        assert admin.get(f"/profiles/{quote(A)}").status_code == 200
    with coordinator.client() as anon:
        assert anon.get(f"/profiles/{quote(A)}").status_code == 401
        assert anon.get("/profiles").status_code == 401
        assert anon.get("/regressions").status_code == 401
