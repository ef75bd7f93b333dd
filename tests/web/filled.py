"""A coordinator filled through its real API, shared by the dashboard's browser tests.

Three chips, two MLX versions, two kernels x two shapes x two dtypes, four runs per series, all
posted by enrolled workers that lease campaign jobs; plus a dead job with its failure message, a
job still leased, a revoked worker, and regressions rows (the one table written directly: the API
only reads and acknowledges them; the detector writes them). Everything posted is recorded in
:class:`Filled` so tests compare the pages with what went in, not with what the pages' own
queries return.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from conftest import (
    POSTGRES_URL,
    Coordinator,
    MigratedTemplates,
    _create_pg_database,
    _drop_pg_database,
)
from sqlalchemy import insert, select

CHIPS = {  # chip -> (backend, os, speed factor, worker name)
    "Apple M3 Max": ("metal", "macOS 15.1", 1.0, "studio-m3max"),
    "NVIDIA H100 80GB HBM3": ("cuda", "Linux 6.1.0-28", 0.3, "gpu-h100-a"),
    "Apple M2": ("metal", "macOS 14.6", 2.1, "mini-m2"),
}
KERNELS = ["rmsnorm", "softmax"]
SHAPES = ["32x4096", "4096x4096"]
DTYPES = ["float16", "float32"]
ROUNDS = ["0.32.3", "0.32.3", "0.32.4", "0.32.4"]  # MLX version of each round of runs
CONFIGS = [{"tg": tg, "vec": vec} for tg in (128, 256, 512) for vec in (2, 4)]
# MLX 0.32.4 slows rmsnorm 4096x4096 on the Apple chips by 15%: the regression story.
REGRESSED = {("Apple M3 Max", "rmsnorm", "4096x4096"), ("Apple M2", "rmsnorm", "4096x4096")}
DRIFT = ("NVIDIA H100 80GB HBM3", "softmax", "4096x4096", "float16")  # golden output off by 0.05


def config_key(config: dict[str, Any]) -> str:
    if config == {"variant": "builtin"}:
        return "builtin"
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


def _stable(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def base_us(chip: str, kernel: str, shape: str, dtype: str) -> float:
    rows, cols = (int(d) for d in shape.split("x"))
    nbytes = rows * cols * (2 if dtype == "float16" else 4) * 2
    return (6.0 + nbytes / 2.0e5) * CHIPS[chip][2] * (1.3 if kernel == "softmax" else 1.0)


def golden(chip: str, kernel: str, shape: str, dtype: str) -> dict[str, Any]:
    rng = random.Random(f"{kernel}{shape}{dtype}")
    sample = [round(rng.uniform(-2, 2), 4) for _ in range(16)]
    if (chip, kernel, shape, dtype) == DRIFT:
        sample = [v + 0.05 for v in sample]
    elif chip == "Apple M2":
        sample = [v * (1 + 1e-7) for v in sample]  # differs, well within any tolerance
    digest = hashlib.sha256(json.dumps(sample).encode()).hexdigest()
    mean = sum(sample) / len(sample)
    return {
        "digest": digest,
        "stats": {
            "mean": mean,
            "std": 1.1,
            "min": min(sample),
            "max": max(sample),
            "abs_mean": sum(abs(v) for v in sample) / len(sample),
        },
        "sample": sample,
        "stride": 1024,
        "numel": 1024 * len(sample),
    }


def make_report(chip: str, kernel: str, shape: str, dtype: str, mlx: str, run: int) -> dict[str, Any]:
    backend, os_name, _, _ = CHIPS[chip]
    rng = random.Random(f"{chip}{kernel}{shape}{dtype}{run}")
    base = base_us(chip, kernel, shape, dtype)
    if mlx == "0.32.4" and (chip, kernel, shape) in REGRESSED:
        base *= 1.15
    trials: list[dict[str, Any]] = []

    def ok(config: dict[str, Any], factor: float) -> None:
        median = base * factor * (1 + rng.uniform(-0.01, 0.01))
        samples = sorted(median * (1 + rng.gauss(0, 0.02)) for _ in range(30))
        trials.append(
            {
                "config_key": config_key(config),
                "config": config,
                "is_builtin": "variant" in config,
                "status": "ok",
                "error": None,
                "samples_us": samples,
                "median_us": samples[15],
                "p10_us": samples[3],
                "p90_us": samples[26],
                "n": 30,
                "max_abs_err": 1e-4,
                "max_rel_err": 2e-4,
            }
        )

    ok({"variant": "builtin"}, 1.05 if kernel == "rmsnorm" else 1.45)
    for config in CONFIGS:
        ok(config, 0.9 + 0.5 * _stable(f"{chip}{kernel}{shape}{dtype}{config_key(config)}"))
    trials.append(
        {
            "config_key": "tg=1024,vec=4",
            "config": {"tg": 1024, "vec": 4},
            "is_builtin": False,
            "status": "compile_error",
            "error": "threadgroup of 1024 exceeds the device limit",
            "samples_us": None,
            "median_us": None,
            "p10_us": None,
            "p90_us": None,
            "n": 0,
            "max_abs_err": None,
            "max_rel_err": None,
        }
    )
    best = min((t for t in trials if t["status"] == "ok"), key=lambda t: t["median_us"])
    return {
        "kernel": kernel,
        "shape": shape,
        "dtype": dtype,
        "seed": 0,
        "strategy": "halving",
        "env": {
            "chip": chip,
            "backend": backend,
            "mlx_version": mlx,
            "os": os_name,
            "driver": "580.65" if backend == "cuda" else None,
            "kernel_hash": hashlib.sha256(kernel.encode()).hexdigest()[:16],
            "gpu_cores": 40 if backend == "metal" else 132,
            "memory_bytes": 64 * 2**30,
        },
        "trials": trials,
        "best_config_key": best["config_key"],
        "golden": golden(chip, kernel, shape, dtype),
    }


@dataclass
class Posted:
    result_id: int
    chip: str
    kernel: str
    shape: str
    dtype: str
    mlx: str
    report: dict[str, Any]

    @property
    def best(self) -> dict[str, Any]:
        return next(t for t in self.report["trials"] if t["config_key"] == self.report["best_config_key"])

    @property
    def builtin(self) -> dict[str, Any]:
        return next(t for t in self.report["trials"] if t["is_builtin"])


@dataclass
class Filled:
    coordinator: Coordinator
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {id, token, chip}
    posted: list[Posted] = field(default_factory=list)
    campaigns: dict[str, int] = field(default_factory=dict)  # name -> id
    dead_job: int = 0
    dead_error: str = ""
    leased_job: int = 0
    regressions: dict[str, int] = field(default_factory=dict)  # label -> id

    @property
    def url(self) -> str:
        return self.coordinator.url

    def latest(self) -> dict[tuple[str, str, str, str], Posted]:
        out: dict[tuple[str, str, str, str], Posted] = {}
        for p in self.posted:  # posted in order: the last one wins
            out[(p.chip, p.kernel, p.shape, p.dtype)] = p
        return out


def _enroll(c: Coordinator, name: str, chip: str, backend: str, os_name: str) -> dict[str, Any]:
    with c.admin() as admin:
        r = admin.post("/enroll-tokens", json={})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
    with c.client() as anon:
        r = anon.post(
            "/workers/enroll",
            json={
                "enrollment_token": token,
                "name": name,
                "chip": chip,
                "backend": backend,
                "os": os_name,
                "mlx_version": "0.32.4",
                "gpu_cores": 40,
                "memory_bytes": 64 * 2**30,
            },
        )
        assert r.status_code == 201, r.text
    return {"id": r.json()["worker_id"], "token": r.json()["token"], "chip": chip}


def _campaign(admin: httpx.Client, **body: Any) -> int:
    r = admin.post("/campaigns", json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def one_m2_result(c: Coordinator) -> None:
    """Enroll an Apple M2 worker and store one rmsnorm 32x4096 float16 run (MLX 0.32.4) through a
    campaign's lease, as the small page tests need."""
    w = _enroll(c, "m2", "Apple M2", "metal", "macOS 14.6")
    with c.admin() as admin:
        _campaign(admin, name="c", kernels=["rmsnorm"], shapes=["32x4096"], dtypes=["float16"],
                  target_chip="Apple M2")
    with c.client(w["token"]) as worker:
        lease = worker.post("/leases", json={}).json()
        report = make_report("Apple M2", "rmsnorm", "32x4096", "float16", "0.32.4", 0)
        r = worker.post(f"/jobs/{lease['job_id']}/result",
                        json={"lease_token": lease["lease_token"], "report": report})
        assert r.status_code == 201, r.text


def _run_queue(filled: Filled, worker: dict[str, Any], mlx: str, run: int) -> None:
    """Lease until nothing is left for this worker, posting a report for each job."""
    with filled.coordinator.client(worker["token"]) as w:
        while True:
            r = w.post("/leases", json={})
            if r.status_code == 204:
                filled.coordinator.settle()  # the detector's confirmation jobs, if any, are queued now
                r = w.post("/leases", json={})
            if r.status_code == 204:
                return
            assert r.status_code == 200, r.text
            job = r.json()
            report = make_report(worker["chip"], job["kernel"], job["shape"], job["dtype"], mlx, run)
            r = w.post(
                f"/jobs/{job['job_id']}/result", json={"lease_token": job["lease_token"], "report": report}
            )
            assert r.status_code == 201, r.text
            filled.posted.append(
                Posted(
                    r.json()["result_id"],
                    worker["chip"],
                    job["kernel"],
                    job["shape"],
                    job["dtype"],
                    mlx,
                    report,
                )
            )


def fill(c: Coordinator) -> Filled:
    filled = Filled(c)
    for chip, (backend, os_name, _, name) in CHIPS.items():
        filled.workers[name] = _enroll(c, name, chip, backend, os_name)
    with c.admin() as admin:
        for run, mlx in enumerate(ROUNDS):
            for chip, (_, _, _, name) in CHIPS.items():
                campaign = f"round {run + 1} · {chip}"
                filled.campaigns[campaign] = _campaign(
                    admin, name=campaign, kernels=KERNELS, shapes=SHAPES, dtypes=DTYPES, target_chip=chip
                )
                _run_queue(filled, filled.workers[name], mlx, run)
        # a job that fails for good, with its message
        filled.campaigns["layernorm bf16 on M2"] = _campaign(
            admin,
            name="layernorm bf16 on M2",
            kernels=["layernorm"],
            shapes=["8192x8192"],
            dtypes=["bfloat16"],
            target_chip="Apple M2",
            max_attempts=1,
        )
        m2 = filled.workers["mini-m2"]
        with c.client(m2["token"]) as w:
            job = w.post("/leases", json={}).json()
            filled.dead_job, filled.dead_error = (
                job["job_id"],
                "launch_error: out of threadgroup memory (32 KiB)",
            )
            r = w.post(
                f"/jobs/{job['job_id']}/fail",
                json={"lease_token": job["lease_token"], "error": filled.dead_error},
            )
            assert r.status_code == 200 and r.json()["state"] == "dead", r.text
        # a campaign in progress: one job leased (the H100's current job), one queued; first let the
        # background loop react to every result (regression detection queues its confirmation jobs)
        c.settle()
        filled.campaigns["rope on H100"] = _campaign(
            admin,
            name="rope on H100",
            kernels=["rope"],
            shapes=["32x1x128", "32x8x128"],
            dtypes=["float16"],
            target_chip="NVIDIA H100 80GB HBM3",
        )
        with c.client(filled.workers["gpu-h100-a"]["token"]) as w:
            job = w.post("/leases", json={}).json()
            filled.leased_job = job["job_id"]
            # confirmed as a real worker does, so it stays leased (an hour: see filled_coordinator)
            r = w.post(f"/jobs/{job['job_id']}/heartbeat", json={"lease_token": job["lease_token"]})
            assert r.status_code == 200, r.text
        # a retired machine
        filled.workers["old-m1"] = _enroll(c, "old-m1", "Apple M1", "metal", "macOS 13.6")
        r = admin.post(f"/workers/{filled.workers['old-m1']['id']}/revoke")
        assert r.status_code == 200, r.text
    _insert_regressions(filled)
    return filled


def _insert_regressions(filled: Filled) -> None:
    """Regressions rows as the detector stores them (direct insert: the one table written so)."""
    from kernelfleet.service.db import db_now, make_engine
    from kernelfleet.service.models import Regression

    def runs(chip: str, kernel: str, shape: str, dtype: str) -> list[Posted]:
        return [
            p for p in filled.posted if (p.chip, p.kernel, p.shape, p.dtype) == (chip, kernel, shape, dtype)
        ]

    rows = []
    for label, chip in (("m3", "Apple M3 Max"), ("m2", "Apple M2")):
        series = runs(chip, "rmsnorm", "4096x4096", "float16")
        before = [p for p in series if p.mlx == "0.32.3"][-1]
        after = [p for p in series if p.mlx == "0.32.4"][0]
        rows.append(
            (
                label,
                {
                    "group_key": "mlx_version=0.32.3->0.32.4",
                    "kernel": "rmsnorm",
                    "shape": "4096x4096",
                    "dtype": "float16",
                    "chip": chip,
                    "config_key": after.report["best_config_key"],
                    "status": "open",
                    "detector": "step",
                    "baseline_median_us": before.best["median_us"],
                    "new_median_us": after.best["median_us"],
                    "effect": after.best["median_us"] / before.best["median_us"] - 1,
                    "p_value": 0.0004,
                    "cause": {"mlx_version": ["0.32.3", "0.32.4"]},
                    "baseline_result_id": before.result_id,
                    "result_id": after.result_id,
                },
            )
        )
    series = runs("NVIDIA H100 80GB HBM3", "softmax", "32x4096", "float32")
    rows.append(
        (
            "h100",
            {
                "group_key": "series:NVIDIA H100 80GB HBM3/softmax/32x4096/float32",
                "kernel": "softmax",
                "shape": "32x4096",
                "dtype": "float32",
                "chip": "NVIDIA H100 80GB HBM3",
                "config_key": None,
                "status": "acknowledged",
                "detector": "changepoint",
                "baseline_median_us": series[0].best["median_us"],
                "new_median_us": series[-1].best["median_us"] * 1.06,
                "effect": 0.06,
                "p_value": None,
                "cause": {},
                "baseline_result_id": series[0].result_id,
                "result_id": series[-1].result_id,
                "acknowledged_note": "thermal throttling on that host",
                "acknowledged_at": db_now(),
            },
        )
    )
    engine = make_engine(filled.coordinator.db_url)
    try:
        # a write transaction from its start (SQLite: BEGIN IMMEDIATE), as the coordinator's own writers
        # take theirs: a deferred one that reads first and then writes fails at once with "database is
        # locked" when the coordinator's background work commits in between (seen under load)
        with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
            for label, row in rows:
                # the detector finds the Apple chips' step at their third run itself: keep its rows
                found = conn.execute(select(Regression.id).where(
                    Regression.chip == row["chip"], Regression.kernel == row["kernel"],
                    Regression.shape == row["shape"], Regression.dtype == row["dtype"],
                    Regression.result_id == row["result_id"])).scalars().first()
                if found is not None:
                    filled.regressions[label] = int(found)
                    continue
                conn.execute(insert(Regression).values(**row))
                filled.regressions[label] = int(
                    conn.execute(
                        select(Regression.id)
                        .where(
                            Regression.chip == row["chip"],
                            Regression.kernel == row["kernel"],
                            Regression.shape == row["shape"],
                            Regression.dtype == row["dtype"],
                            Regression.detector == row["detector"],
                        )
                        .order_by(Regression.id.desc())
                    )
                    .scalars()
                    .first()
                )
    finally:
        engine.dispose()


def filled_coordinator(backend: str, workdir: Path, templates: MigratedTemplates, *, empty: bool = False,
                       **env: str) -> Iterator[Filled]:
    """A migrated database (SQLite file or a fresh PostgreSQL database, a copy of ``templates``'
    migrated one), a running coordinator on it (in-thread), filled through the API (left empty with
    ``empty=True``). Same pattern as the ``coordinator`` fixture, for a module scope."""
    pg_name = None
    if backend == "sqlite":
        url = f"sqlite:///{workdir / 'kernelfleet.db'}"
        templates.fill(url)
    else:
        assert POSTGRES_URL, "KERNELFLEET_TEST_POSTGRES_URL is not set"
        pg_name, url = _create_pg_database(templates.template("postgres"))
    try:
        # the one leased job stays leased while a test module reads the pages (minutes on a busy host)
        env = {"KERNELFLEET_LEASE_SECONDS": "3600", **env}
        # in-thread (the app under uvicorn in this process): the pages' subject is not processes
        c = Coordinator(db_url=url, workdir=workdir, admin_token="adm-" + secrets.token_urlsafe(24),
                        env_overrides=env, process=False)
        c.start()
        try:
            yield Filled(c) if empty else fill(c)
        finally:
            c.stop()
    finally:
        if pg_name:
            _drop_pg_database(pg_name)
