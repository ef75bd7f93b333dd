"""Regression detection through the real coordinator: results posted through the API (import and
the lease flow), a slower run -> a confirm job and a ``confirming`` regression, the confirmation
-> ``open``, acknowledge -> ``acknowledged``; a spike the confirmation does not reproduce ->
``dismissed``; the offline scan finds a gradual drift that no single run reveals."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np

CHIP = "Apple M3 Max"
BEST = "tg=256,vec=4"


def make_report(
    shape: str,
    median_us: float,
    *,
    rng: np.random.Generator,
    mlx: str = "0.32.3",
    chip: str = CHIP,
    backend: str = "metal",
    spread: float = 0.01,
) -> dict[str, Any]:
    """A tuning report: the best config runs at ``median_us`` (50 raw samples), the built-in 30 % slower."""

    def trial(key: str, config: dict[str, Any], center: float, builtin: bool) -> dict[str, Any]:
        samples = center * np.exp(rng.normal(0.0, spread, 50))
        return {
            "config_key": key,
            "config": config,
            "is_builtin": builtin,
            "status": "ok",
            "error": None,
            "samples_us": [float(v) for v in samples],
            "median_us": float(np.median(samples)),
            "p10_us": float(np.percentile(samples, 10)),
            "p90_us": float(np.percentile(samples, 90)),
            "n": 50,
            "max_abs_err": 0.0,
            "max_rel_err": 0.0,
        }

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
            "driver": None,
            "kernel_hash": "k1",
            "gpu_cores": 40,
            "memory_bytes": 64 << 30,
        },
        "trials": [
            trial(BEST, {"tg": 256, "vec": 4}, median_us, False),
            trial("builtin", {"variant": "builtin"}, median_us * 1.3, True),
        ],
        "best_config_key": BEST,
        "golden": {
            "digest": "0" * 64,
            "stats": {"mean": 0.0, "std": 1.0, "min": -3.0, "max": 3.0, "abs_mean": 0.8},
            "sample": [0.0],
            "stride": 1,
            "numel": 1,
        },
    }


def enroll(coordinator: Any, chip: str = CHIP, backend: str = "metal") -> httpx.Client:
    with coordinator.admin() as admin:
        token = admin.post("/enroll-tokens", json={}).json()["token"]
    with coordinator.client() as anon:
        r = anon.post(
            "/workers/enroll",
            json={
                "enrollment_token": token,
                "name": "mac-1",
                "chip": chip,
                "backend": backend,
                "os": "macOS 15.1",
                "mlx_version": "0.32.4",
            },
        )
    assert r.status_code == 201, r.text
    return coordinator.client(r.json()["token"])  # type: ignore[no-any-return]


def import_history(coordinator: Any, shape: str, medians: list[float], rng: np.random.Generator) -> None:
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [make_report(shape, m, rng=rng) for m in medians]})
    assert r.status_code == 201, r.text


def run_leased_job(worker: httpx.Client, report: dict[str, Any]) -> dict[str, Any]:
    lease = worker.post("/leases", json={})
    assert lease.status_code == 200, lease.text
    job = lease.json()
    r = worker.post(
        f"/jobs/{job['job_id']}/result", json={"lease_token": job["lease_token"], "report": report}
    )
    assert r.status_code == 201, r.text
    return job  # type: ignore[no-any-return]


def regressions(coordinator: Any, **params: str) -> list[dict[str, Any]]:
    coordinator.settle()  # the detector runs in the background loop, right after each result
    with coordinator.client() as c:
        r = c.get("/regressions", params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def scan(coordinator: Any, timeout: float = 60.0) -> dict[str, Any]:
    """Ask for a change-point scan (queued: 202) and follow it until the background loop finished it."""
    coordinator.settle()  # the scan sees every stored result's online verdict first, as a user's would
    with coordinator.admin() as admin:
        queued = admin.post("/regressions/scan")
        assert queued.status_code == 202, queued.text
        body = queued.json()
        assert body["status"] == "queued" and body["url"] == f"/api/v1/regressions/scans/{body['id']}"
        deadline = time.monotonic() + timeout
        while body["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, f"scan still {body['status']} after {timeout} s"
            time.sleep(0.1)
            r = admin.get(f"/regressions/scans/{body['id']}")
            assert r.status_code == 200, r.text
            body = r.json()
    assert body["status"] == "done", body
    return body  # type: ignore[no-any-return]


def test_slower_run_is_confirmed_then_acknowledged(coordinator: Any) -> None:
    rng = np.random.default_rng(1)
    shape = "4096x4096"
    import_history(coordinator, shape, [100.0 * (1 + 0.005 * np.sin(i)) for i in range(10)], rng)
    assert regressions(coordinator) == []  # steady history: nothing suspected

    worker = enroll(coordinator)
    with coordinator.admin() as admin:
        r = admin.post(
            "/campaigns",
            json={
                "name": "nightly",
                "kernels": ["rmsnorm"],
                "shapes": [shape],
                "dtypes": ["float16"],
                "target_backend": "metal",
            },
        )
        assert r.status_code == 201, r.text
    run_leased_job(worker, make_report(shape, 125.0, rng=rng, mlx="0.32.4"))

    [reg] = regressions(coordinator)
    assert reg["status"] == "confirming"
    assert reg["chip"] == CHIP and reg["kernel"] == "rmsnorm" and reg["shape"] == shape
    assert reg["config_key"] == BEST and reg["detector"] == "step"
    assert 0.2 < reg["effect"] < 0.3
    assert reg["cause"] == {"mlx_version": ["0.32.3", "0.32.4"]}
    assert "mlx_version" in reg["group_key"]

    # the confirmation job targets exactly this chip and backend and is leased like any job
    confirm = run_leased_job(worker, make_report(shape, 124.0, rng=rng, mlx="0.32.4"))
    assert confirm["kind"] == "confirm" and confirm["job_id"] == reg["confirm_job_id"]
    with coordinator.admin() as admin:
        jobs = admin.get("/jobs", params={"limit": 100}).json()
    job = next(
        j for j in (jobs["items"] if isinstance(jobs, dict) else jobs) if j["id"] == reg["confirm_job_id"]
    )
    assert job["target_chip"] == CHIP and job["target_backend"] == "metal" and job["state"] == "done"

    [reg] = regressions(coordinator)
    assert reg["status"] == "open"
    assert regressions(coordinator, status="open", chip=CHIP, kernel="rmsnorm")[0]["id"] == reg["id"]
    assert regressions(coordinator, status="dismissed") == []
    assert regressions(coordinator, chip="Apple M1") == []

    with coordinator.client(worker.headers["authorization"].split()[1]) as w:
        assert w.post(f"/regressions/{reg['id']}/acknowledge", json={}).status_code == 403
    with coordinator.admin() as admin:
        r = admin.post(f"/regressions/{reg['id']}/acknowledge", json={"note": "known MLX 0.32.4 issue"})
        assert r.status_code == 200, r.text
        assert r.json() == {"acknowledged": [reg["id"]], "cancelled_jobs": []}  # its confirm job ran
        again = admin.post(f"/regressions/{reg['id']}/acknowledge", json={})
        assert again.status_code == 409 and "already acknowledged" in again.json()["detail"]
        missing = admin.post("/regressions/999999/acknowledge", json={})
        assert missing.status_code == 404 and "no regression" in missing.json()["detail"]
        bad = admin.post(f"/regressions/{reg['id']}/acknowledge", json={"note": "x", "extra": 1})
        assert bad.status_code == 422
    [reg] = regressions(coordinator, status="acknowledged")
    assert reg["acknowledged_note"] == "known MLX 0.32.4 issue" and reg["acknowledged_at"]

    # the slower level is the new baseline: another run there raises nothing new
    with coordinator.admin() as admin:
        admin.post("/results/import", json={"reports": [make_report(shape, 125.5, rng=rng, mlx="0.32.4")]})
    assert len(regressions(coordinator)) == 1
    worker.close()


def test_spike_not_reproduced_is_dismissed(coordinator: Any) -> None:
    rng = np.random.default_rng(2)
    shape = "1024x4096"
    import_history(coordinator, shape, [50.0 * (1 + 0.004 * np.cos(i)) for i in range(8)], rng)
    worker = enroll(coordinator)
    with coordinator.admin() as admin:
        admin.post(
            "/campaigns",
            json={"name": "spiky", "kernels": ["rmsnorm"], "shapes": [shape], "dtypes": ["float16"]},
        )
    run_leased_job(worker, make_report(shape, 80.0, rng=rng))  # one noisy run: +60 %
    [reg] = regressions(coordinator)
    assert reg["status"] == "confirming" and reg["cause"] == {}
    assert "nothing recorded changed" in reg["cause_text"]

    confirm = run_leased_job(worker, make_report(shape, 50.2, rng=rng))  # the re-run is normal
    assert confirm["kind"] == "confirm"
    [reg] = regressions(coordinator)
    assert reg["status"] == "dismissed"
    with coordinator.admin() as admin:
        r = admin.post(f"/regressions/{reg['id']}/acknowledge", json={})
    assert r.status_code == 409 and "dismissed" in r.json()["detail"]
    worker.close()


def test_scan_finds_gradual_drift(coordinator: Any) -> None:
    rng = np.random.default_rng(3)
    shape = "8192x8192"
    # 10 flat runs, then +0.25 % per run for 40 runs (+10 % in all): each run is within the noise and
    # the minimum effect of its recent history, so only the change-point pass sees the drift
    zigzag = [0.006, -0.004, 0.002, -0.006, 0.004]
    medians = [200.0 * (1 + 0.0025 * max(0, i - 10)) * (1 + zigzag[i % 5]) for i in range(50)]
    import_history(coordinator, shape, medians, rng)
    assert regressions(coordinator) == []

    with coordinator.client() as anon:
        assert anon.post("/regressions/scan").status_code == 401
    body = scan(coordinator)
    assert body["series"] == 1 and len(body["created"]) == 1 and body["finished_at"] >= body["started_at"]
    [reg] = regressions(coordinator)
    assert reg["detector"] == "changepoint" and reg["status"] == "open" and reg["effect"] >= 0.03
    # a second scan finds the same change and creates nothing new
    assert scan(coordinator)["created"] == []
    with coordinator.client() as anon:
        missing_scan = anon.get("/regressions/scans/424242")
        assert missing_scan.status_code == 404 and "no regression scan" in missing_scan.json()["detail"]
        assert anon.get(f"/regressions/{reg['id']}").json()["id"] == reg["id"]
        missing = anon.get("/regressions/424242")
        assert missing.status_code == 404 and "no regression" in missing.json()["detail"]
        assert anon.get("/regressions", params={"status": "bogus"}).status_code == 422


def test_confirmation_that_dies_dismisses_the_suspect(coordinator_factory: Any) -> None:
    coordinator = coordinator_factory(KERNELFLEET_MAX_ATTEMPTS="1")
    rng = np.random.default_rng(3)
    shape = "2048x4096"
    import_history(coordinator, shape, [50.0 * (1 + 0.004 * np.cos(i)) for i in range(8)], rng)
    worker = enroll(coordinator)
    with coordinator.admin() as admin:
        admin.post(
            "/campaigns",
            json={"name": "lost", "kernels": ["rmsnorm"], "shapes": [shape], "dtypes": ["float16"]},
        )
    run_leased_job(worker, make_report(shape, 80.0, rng=rng))
    [reg] = regressions(coordinator)
    assert reg["status"] == "confirming"
    confirm = worker.post("/leases", json={}).json()
    assert confirm["kind"] == "confirm" and confirm["job_id"] == reg["confirm_job_id"]
    r = worker.post(f"/jobs/{confirm['job_id']}/fail",
                    json={"lease_token": confirm["lease_token"], "error": "GPU fell off the bus"})
    assert r.status_code == 200 and r.json()["state"] == "dead", r.text
    [reg] = regressions(coordinator)
    assert reg["status"] == "dismissed"
    note = reg["acknowledged_note"]
    assert "confirmation run failed" in note and "GPU fell off the bus" in note
    worker.close()
