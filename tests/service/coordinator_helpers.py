"""Helpers for coordinator tests: enroll workers and build valid tuning reports."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
from conftest import Coordinator


def enroll(coordinator: Coordinator, name: str = "w", chip: str = "NVIDIA H100 80GB HBM3",
           backend: str = "cuda") -> tuple[int, str]:
    """Enroll one worker through the API; returns ``(worker_id, worker_token)``."""
    with coordinator.admin() as admin:
        r = admin.post("/enroll-tokens", json={})
        assert r.status_code == 201, r.text
        enroll_token = r.json()["token"]
    with coordinator.client() as c:
        r = c.post("/workers/enroll", json={
            "enrollment_token": enroll_token, "name": name, "chip": chip, "backend": backend,
            "gpu_cores": 132, "memory_bytes": 80 * 2**30, "os": "Linux 6.1", "mlx_version": "0.32.4",
            "driver": "580.65"})
        assert r.status_code == 201, r.text
        body = r.json()
    return int(body["worker_id"]), str(body["token"])


def create_campaign(coordinator: Coordinator, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "c", "kernels": ["rmsnorm"], "shapes": ["4096x4096"],
                            "dtypes": ["float16"]}
    body.update(overrides)
    with coordinator.admin() as admin:
        r = admin.post("/campaigns", json=body)
        assert r.status_code == 201, r.text
        return dict(r.json())


def shapes(n: int) -> list[str]:
    return [f"{i + 1}x4096" for i in range(n)]


def make_report(kernel: str = "rmsnorm", shape: str = "4096x4096", dtype: str = "float16",
                chip: str = "NVIDIA H100 80GB HBM3", backend: str = "cuda", median: float = 10.0,
                seed: int = 0) -> dict[str, Any]:
    """A valid tuning report: a builtin trial, a tuned trial that wins, and a failed one."""
    samples = [median * (1 + 0.01 * (i % 5)) for i in range(20)]
    return {
        "kernel": kernel, "shape": shape, "dtype": dtype, "seed": seed, "strategy": "halving",
        "env": {"chip": chip, "backend": backend, "mlx_version": "0.32.4", "os": "Linux 6.1",
                "driver": "580.65", "kernel_hash": hashlib.sha256(kernel.encode()).hexdigest()[:16],
                "gpu_cores": 132, "memory_bytes": 80 * 2**30},
        "trials": [
            {"config_key": "builtin", "config": {"variant": "builtin"}, "is_builtin": True, "status": "ok",
             "error": None, "samples_us": [s * 1.2 for s in samples], "median_us": median * 1.2,
             "p10_us": median * 1.19, "p90_us": median * 1.25, "n": 20, "max_abs_err": 0.0,
             "max_rel_err": 0.0},
            {"config_key": "tg=256,vec=4", "config": {"tg": 256, "vec": 4}, "is_builtin": False,
             "status": "ok",
             "error": None, "samples_us": samples, "median_us": median, "p10_us": median * 0.99,
             "p90_us": median * 1.04, "n": 20, "max_abs_err": 1e-3, "max_rel_err": 2e-3},
            {"config_key": "tg=1024,vec=8", "config": {"tg": 1024, "vec": 8}, "is_builtin": False,
             "status": "compile_error", "error": "too many threads", "samples_us": None, "median_us": None,
             "p10_us": None, "p90_us": None, "n": 0, "max_abs_err": None, "max_rel_err": None},
        ],
        "best_config_key": "tg=256,vec=4",
        "golden": {"digest": hashlib.sha256(f"{kernel}{shape}{dtype}".encode()).hexdigest(),
                   "stats": {"mean": 0.01, "std": 1.0, "min": -4.0, "max": 4.0, "abs_mean": 0.8},
                   "sample": [0.1, -0.2, 0.3], "stride": 4096, "numel": 4096 * 4096},
    }


def lease(client: httpx.Client, confirm: bool = True) -> dict[str, Any] | None:
    """Lease a job and, as the agent does, confirm it at once with a heartbeat (an unconfirmed lease
    goes back to the queue after KERNELFLEET_LEASE_CONFIRM_SECONDS without costing an attempt)."""
    r = client.post("/leases", json={})
    if r.status_code == 204:
        return None
    assert r.status_code == 200, r.text
    got = dict(r.json())
    if confirm:
        hb = client.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
        assert hb.status_code == 200, hb.text
    return got


def complete(client: httpx.Client, lease_body: dict[str, Any], **report_overrides: Any) -> httpx.Response:
    report = make_report(kernel=lease_body["kernel"], shape=lease_body["shape"], dtype=lease_body["dtype"],
                         **report_overrides)
    return client.post(f"/jobs/{lease_body['job_id']}/result",
                       json={"lease_token": lease_body["lease_token"], "report": report})


def measured_shapes(factory: Any, chip: str) -> set[str]:
    """The shapes of ``chip``'s newest stored profile that were measured on it (not predicted)."""
    from kernelfleet.service import profiles

    with factory() as session:
        row = profiles.latest(session, chip, None)
        assert row is not None, f"no profile stored for {chip}"
        return {e["shape"] for e in row.body["entries"] if not e["predicted"]}
