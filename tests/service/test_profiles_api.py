"""Profiles through the real coordinator: built in the background from the incremental stats of
imported results, versioned with an ETag (``If-None-Match`` -> 304), rebuilt when new results arrive,
per MLX version too, with evidence on measured entries and calibrated predictions for shapes never
tuned on the chip; listed with their freshness and measured/predicted counts."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import numpy as np

A = "Apple M3 Max"
B = "Apple M3 Pro"


def report(chip: str, shape: str, times: dict[str, float], *, mlx: str = "0.32.4",
           backend: str = "metal") -> dict[str, Any]:
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
            "backend": backend,
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


def test_profiles_etag_versions_and_predictions(coordinator_factory: Any) -> None:
    coordinator = coordinator_factory(KERNELFLEET_PREDICTION_MIN_CONFIDENCE="0")
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
    # versions count builds, not imports: the first calibration rebuilds the profile from the same
    # results when it comes after the first build, so wait until the builder has nothing queued
    coordinator.settle(profiles=True)
    body = coordinator.profile(A)
    first = body["version"]
    with coordinator.client() as c:
        r = c.get(f"/profiles/{quote(A)}")
        assert r.status_code == 200, r.text
        etag = r.headers["etag"]
        assert body["schema"] == "kernelfleet-profile/1" and body["chip"] == A and first in (1, 2)
        assert etag == f'"{body["etag"]}"' and body["mlx_version"] is None and body["backend"] == "metal"
        entries = {(e["shape"], e["predicted"]): e for e in body["entries"]}
        tuned = entries[("4096x4096", False)]
        assert tuned["config_key"] == FAST and tuned["config"] == {"rpg": 1, "tg": 256, "vec": 4}
        assert tuned["median_us"] == 40.0 and tuned["speedup"] == 60.0 / 40.0 and tuned["runs"] == 1
        # its evidence: one imported run, no enrolled worker, when, and the speedup interval of one run
        # (from both trials' p10/p90: 60*0.992/(40*1.008) .. 60*1.008/(40*0.992))
        assert tuned["imported_runs"] == 1 and tuned["workers"] == 0 and tuned["last_seen"]
        lo, hi = tuned["speedup_interval"]
        assert lo == round(60 * 0.992 / (40 * 1.008), 4) and hi == round(60 * 1.008 / (40 * 0.992), 4)
        # B's shape was never tuned on A: predicted from A's nearby shapes and B's run (both Metal)
        guess = entries[("2048x4096", True)]
        assert guess["config_key"] == FAST and 0 < guess["confidence"] <= 1 and "fallback" not in guess
        assert {b["chip"] for b in guess["basis"]} == {A, B}
        # a failed (mismatch) trial is never chosen
        assert all(e["config_key"] != "rpg=1,tg=32,vec=1" for e in body["entries"])

        assert c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": etag}).status_code == 304
        assert c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": f'W/{etag}, "x"'}).status_code == 304
        assert c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": '"stale"'}).status_code == 200

        [listed] = [p for p in c.get("/profiles").json() if p["chip"] == A and p["mlx_version"] is None]
        assert listed["version"] == first and listed["entries"] == len(body["entries"])
        assert listed["measured"] == 2
        assert listed["predicted"] + listed["fallback"] == len(body["entries"]) - 2
        assert listed["pull_command"] == f'kernelfleet pull --chip "{A}"'

    # new results: the built-in now wins at 1024x4096 -> a newer version with a new ETag
    with coordinator.admin() as admin:
        r = admin.post(
            "/results/import",
            json={"reports": [report(A, "1024x4096", {FAST: 12.0, SLOW: 15.0, "builtin": 6.0})]},
        )
        assert r.status_code == 201, r.text
    coordinator.settle(profiles=True)
    body = coordinator.profile(A, min_version=first + 1)
    with coordinator.client() as c:
        r = c.get(f"/profiles/{quote(A)}", headers={"If-None-Match": etag})
        assert r.status_code == 200 and r.headers["etag"] != etag
        small = next(e for e in body["entries"] if e["shape"] == "1024x4096" and not e["predicted"])
        # same-run speedups 14/12 and 6/12: their median is below 1, so the built-in is the pick
        assert small["config_key"] == "builtin" and small["config"] == {"variant": "builtin"}
        assert small["runs"] == 2 and small["speedup"] == 1.0

    # per MLX version: only that version's results
    with coordinator.admin() as admin:
        r = admin.post(
            "/results/import",
            json={
                "reports": [report(A, "4096x4096", {FAST: 70.0, SLOW: 50.0, "builtin": 65.0}, mlx="0.33.0")]
            },
        )
        assert r.status_code == 201, r.text
    coordinator.settle(profiles=True)
    body = coordinator.profile(A, mlx_version="0.33.0")
    assert body["mlx_version"] == "0.33.0" and body["version"] in (1, 2)
    [tuned] = [e for e in body["entries"] if not e["predicted"]]
    assert tuned["shape"] == "4096x4096" and tuned["config_key"] == SLOW
    with coordinator.client() as c:
        missing = c.get(f"/profiles/{quote(A)}", params={"mlx_version": "9.9.9"})
        assert missing.status_code == 404 and "no measured results" in missing.json()["detail"]
        # a chip with no results at all: 404 naming the closest chips that have data (same backend)
        unknown = c.get("/profiles/" + quote("Apple M4 Max"))
        assert unknown.status_code == 404 and "run a tuning campaign" in unknown.json()["detail"]
        assert A in unknown.json()["detail"] and "allow_predicted" in unknown.json()["detail"]
        chips = {(p["chip"], p["mlx_version"]) for p in c.get("/profiles").json()}
        assert {(A, None), (A, "0.33.0")} <= chips


def test_predicted_only_profile_on_request_and_never_slower_than_builtin(coordinator: Any) -> None:
    """Apple M4 Max has no results: with allow_predicted it gets predicted entries only, each marked;
    a config that measured slower than the built-in is never chosen, measured or predicted (the measured
    entry names it as its ``custom``, with its speedup)."""
    worse = "rpg=2,tg=256,vec=4"
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [
            report(A, "4096x4096", {FAST: 40.0, SLOW: 55.0, "builtin": 60.0}),
            report(A, "1024x4096", {worse: 16.0, "builtin": 14.0}),
        ]})
        assert r.status_code == 201, r.text
    coordinator.profile(A)
    with coordinator.client() as c:
        assert c.get("/profiles/" + quote("Apple M4 Max")).status_code == 404
    body = coordinator.profile("Apple M4 Max", allow_predicted="true")
    assert body["entries"] and all(e["predicted"] for e in body["entries"])
    assert body["counts"]["measured"] == 0
    for e in body["entries"]:
        assert {b["chip"] for b in e["basis"]} <= {A}
        assert e["config_key"] != worse or e["speedup"] > 1.0
        if "fallback" in e:
            assert e["config_key"] == "builtin" and e["speedup"] == 1.0
    a = coordinator.profile(A)
    [measured] = [e for e in a["entries"] if e["shape"] == "1024x4096" and not e["predicted"]]
    assert measured["config_key"] == "builtin"
    # its fastest custom config, which a layer block's fused launch may still run (ProfileView.fused_choice)
    custom = measured["custom"]
    assert custom["config_key"] == worse and custom["config"] == {"rpg": 2, "tg": 256, "vec": 4}
    assert custom["speedup"] == round(14.0 / 16.0, 4) and custom["median_us"] == 16.0
    lo, hi = custom["speedup_interval"]
    assert lo < custom["speedup"] < hi < 1.0
    assert all("custom" not in e for e in a["entries"] if e["config_key"] != "builtin")
    with coordinator.client() as c:
        [listed] = [p for p in c.get("/profiles").json() if p["chip"] == "Apple M4 Max"]
        assert listed["measured"] == 0 and listed["pull_command"].endswith("--allow-predicted")
        # only chips of the chip table get predicted-only profiles (anyone may ask: keep it bounded)
        made_up = c.get("/profiles/" + quote("Apple M99 Hyper"), params={"allow_predicted": "true"})
        assert made_up.status_code == 404 and "not in the chip table" in made_up.json()["detail"]


def test_profiles_never_cross_backends(coordinator_factory: Any) -> None:
    """Metal, CUDA and CPU results side by side: the Metal chip's profile never cites a CUDA or CPU
    result, and the CPU chip's profile holds only built-ins."""
    coordinator = coordinator_factory(KERNELFLEET_PREDICTION_MIN_CONFIDENCE="0")
    h100, cpu = "NVIDIA H100 80GB HBM3", "AMD EPYC 7763 64-Core Processor"
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [
            report(A, "4096x4096", {FAST: 40.0, "builtin": 60.0}),
            *(report(h100, s, {SLOW: 5.0, FAST: 9.0, "builtin": 8.0}, backend="cuda")
              for s in ("2048x4096", "1024x4096", "8192x4096")),
            report(cpu, "2048x4096", {FAST: 500.0, "builtin": 900.0}, backend="cpu"),
            report(cpu, "4096x4096", {"builtin": 1800.0}, backend="cpu"),
        ]})
        assert r.status_code == 201, r.text
    metal = coordinator.profile(A)
    assert metal["backend"] == "metal"
    cited = {b["chip"] for e in metal["entries"] if e["predicted"] for b in e["basis"]}
    assert cited == {A}
    # predicted: the catalog's shapes from A's own run; not the shapes only CUDA and CPU chips measured
    assert any(e["predicted"] for e in metal["entries"])
    assert not any(e["shape"] in ("2048x4096", "8192x4096") for e in metal["entries"])
    cpu_profile = coordinator.profile(cpu)
    assert cpu_profile["backend"] == "cpu"
    assert cpu_profile["entries"] and all(e["config_key"] == "builtin" for e in cpu_profile["entries"])
    assert not any(e["predicted"] for e in cpu_profile["entries"])
    cuda = coordinator.profile(h100)
    assert {b["chip"] for e in cuda["entries"] if e["predicted"] for b in e["basis"]} <= {h100}


def test_profiles_private_when_dashboard_is_not_public(coordinator_factory: Any) -> None:
    coordinator = coordinator_factory(KERNELFLEET_DASHBOARD_PUBLIC="false")
    with coordinator.admin() as admin:
        admin.post(
            "/results/import", json={"reports": [report(A, "4096x4096", {FAST: 40.0, "builtin": 60.0})]}
        )
    coordinator.profile(A)
    with coordinator.client() as anon:
        assert anon.get(f"/profiles/{quote(A)}").status_code == 401
        assert anon.get("/profiles").status_code == 401
        assert anon.get("/regressions").status_code == 401
