"""One worker, one coordinator, one machine: a small campaign end to end with the real CLI.

Starts ``kernelfleet serve`` on a fresh SQLite database, mints an enrollment token, creates a
campaign for this machine's backend, runs ``kernelfleet worker --max-jobs N`` until the campaign is
worked through, then writes what was stored (jobs, the worker record, every result with its trial
counts) to ``OUT/fleet_run.json`` and prints a table. Used for issue 4's GPU run::

    python benchmarks/fleet_run.py --backend cuda --shapes 32x4096,4096x4096 \\
        --dtypes float16,bfloat16 --budget 2 --out "$OUT"

Exit status 0 only when every job of the campaign is done.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text

console = Console(width=160)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelfleet.worker.cli", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stored_results(db_url: str) -> list[dict[str, Any]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = (
                conn.execute(
                    text(
                        "SELECT r.id, r.job_id, r.worker_id, r.kernel, r.shape, r.dtype, r.chip,"
                        " r.backend, r.mlx_version, r.driver, r.strategy, r.best_config_key,"
                        " r.best_median_us, r.builtin_median_us,"
                        " (SELECT COUNT(*) FROM trials t WHERE t.result_id = r.id) AS trials,"
                        " (SELECT COUNT(*) FROM trials t WHERE t.result_id = r.id"
                        "  AND t.status = 'ok') AS trials_ok"
                        " FROM results r ORDER BY r.id"
                    )
                )
                .mappings()
                .all()
            )
            return [dict(r) for r in rows]
    finally:
        engine.dispose()


def fitting_kernels(wanted: list[str] | None, shapes: list[str], dtypes: list[str]) -> list[str]:
    """The catalog kernels (or ``wanted``) that accept every shape and dtype asked for."""
    from kernelfleet.kernels.catalog import NAMES, get_spec
    from kernelfleet.kernels.spec import KernelError
    from kernelfleet.worker.tuner import resolve

    out = []
    for name in wanted or NAMES:
        try:
            spec = get_spec(name)
            for shape in shapes:
                for dtype in dtypes:
                    resolve(spec, shape, dtype)
        except KernelError as e:
            console.print(f"[yellow]skipping {name}[/]: {e}")
            continue
        out.append(name)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "metal", "cpu"])
    ap.add_argument("--kernels", default="", help="comma-separated; default: the whole catalog")
    ap.add_argument("--shapes", default="32x4096,4096x4096")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of measurement per job")
    ap.add_argument("--strategy", default="halving", help="the worker's search strategy")
    ap.add_argument("--out", type=Path, default=Path("fleet-run"))
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds for the whole campaign")
    args = ap.parse_args()

    kernels = fitting_kernels(
        args.kernels.split(",") if args.kernels else None, args.shapes.split(","), args.dtypes.split(",")
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kf-fleet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{workdir / 'kernelfleet.db'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    admin_token = "kfa_" + secrets.token_urlsafe(24)
    env = dict(
        os.environ, KERNELFLEET_DATABASE_URL=db_url, KERNELFLEET_ADMIN_TOKEN=admin_token, PYTHONUNBUFFERED="1"
    )

    subprocess.run(cli("db", "upgrade", "--database-url", db_url), check=True, env=env)
    with open(workdir / "coordinator.log", "wb") as log:
        coordinator = subprocess.Popen(
            cli("serve", "--host", "127.0.0.1", "--port", str(port)),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if coordinator.poll() is not None or time.monotonic() > deadline:
                console.print((workdir / "coordinator.log").read_text())
                return 2
            time.sleep(0.2)
        admin = httpx.Client(
            base_url=url + "/api/v1", headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
        )
        enroll = admin.post("/enroll-tokens", json={}).json()["token"]
        campaign = admin.post(
            "/campaigns",
            json={
                "name": f"fleet-run-{args.backend}",
                "kernels": kernels,
                "shapes": args.shapes.split(","),
                "dtypes": args.dtypes.split(","),
                "target_backend": args.backend,
            },
        )
        if campaign.status_code != 201:
            console.print(f"campaign refused: {campaign.status_code} {campaign.text}")
            return 2
        cid = campaign.json()["id"]
        n_jobs = campaign.json()["progress"]["total"]
        console.print(f"campaign {cid}: {n_jobs} jobs ({', '.join(kernels)} x {args.shapes} x {args.dtypes})")

        t0 = time.monotonic()
        with open(workdir / "worker.log", "wb") as wlog:
            worker = subprocess.Popen(
                cli(
                    "worker",
                    "--coordinator",
                    url,
                    "--enroll-token",
                    enroll,
                    "--state-dir",
                    str(workdir / "worker"),
                    "--budget",
                    str(args.budget),
                    "--strategy",
                    args.strategy,
                    "--poll-seconds",
                    "1",
                    "--name",
                    socket.gethostname(),
                ),
                env=env,
                stdout=wlog,
                stderr=subprocess.STDOUT,
            )
        while time.monotonic() - t0 < args.timeout and worker.poll() is None:
            progress = admin.get(f"/campaigns/{cid}").json()["progress"]
            if progress["done"] + progress["dead"] == n_jobs:
                break
            time.sleep(1)
        worker.send_signal(signal.SIGTERM)
        worker_exit = worker.wait(timeout=120)
        wall = time.monotonic() - t0
        console.print((workdir / "worker.log").read_text(errors="replace"))

        jobs = admin.get("/jobs", params={"campaign_id": cid, "limit": 10_000}).json()
        summary = {
            "backend": args.backend,
            "budget_s": args.budget,
            "worker_exit": worker_exit,
            "wall_seconds": round(wall, 1),
            "campaign": admin.get(f"/campaigns/{cid}").json(),
            "workers": admin.get("/workers").json(),
            "jobs": jobs,
            "results": stored_results(db_url),
        }
        admin.close()
    finally:
        if coordinator.poll() is None:
            os.killpg(coordinator.pid, signal.SIGTERM)
            coordinator.wait(timeout=30)
    (args.out / "fleet_run.json").write_text(json.dumps(summary, indent=2, default=str))
    for name in ("coordinator.log", "worker.log"):
        (args.out / name).write_bytes((workdir / name).read_bytes()[-500_000:])

    chips = sorted({r["chip"] for r in summary["results"]})
    table = Table(
        title=f"stored results on {', '.join(chips)} ({args.backend}; worker exit {worker_exit}; {wall:.0f}s)"
    )
    for col in (
        "job",
        "kernel",
        "shape",
        "dtype",
        "best config",
        "best us",
        "built-in us",
        "speedup",
        "trials ok",
    ):
        table.add_column(col)
    for r in summary["results"]:
        best, builtin = r["best_median_us"], r["builtin_median_us"]
        table.add_row(
            str(r["job_id"]),
            r["kernel"],
            r["shape"],
            r["dtype"],
            str(r["best_config_key"]),
            f"{best:.2f}" if best else "-",
            f"{builtin:.2f}" if builtin else "-",
            f"{builtin / best:.2f}x" if best and builtin else "-",
            f"{r['trials_ok']}/{r['trials']}",
        )
    console.print(table)
    states = [j["state"] for j in jobs]
    console.print(f"jobs: {len(jobs)}, done: {states.count('done')}, results: {len(summary['results'])}")
    return 0 if states and all(s == "done" for s in states) and len(summary["results"]) == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
