"""The coordinator's CPU per worker request, by route: what decides how many workers one process holds.

A real ``kernelfleet serve`` process on a fresh database (PostgreSQL with ``--postgres``, else a SQLite
file); ``--workers`` workers enroll and each leases one job; then, route by route, ``--requests``
requests are sent by ``--concurrency`` clients at once, and the server process's CPU time (user +
system, from /proc) over each route's run is divided by its requests. Routes:

- ``heartbeat``: ``POST /jobs/{id}/heartbeat`` on a held lease (what a fleet of long tunes mostly sends);
- ``heartbeat-unseen``: the same, each the first request of its worker to a second server process
  started for it (on the same database): the auth-first middleware (service/auth_first.py) looks the
  token up, as it did for every heartbeat of a fleet whose heartbeats were further apart than its
  memory of a token (60 s before issue 33's 20,000-worker work). One heartbeat per enrolled worker,
  less the first 50 (they fill the new process's connection pool): enroll ``--workers`` 1,000 or more;
- ``lease-empty``: ``POST /leases`` with nothing queued for the worker and no wait (an idle poll, 204);
- ``lease``: ``POST /leases`` that gets a job (jobs queued for the run);
- ``result``: ``POST /jobs/{id}/result`` with a real ~40 KB report (``h100_fleet_tuning.jsonl``).

The client (asyncio + aiohttp, one connection per client) runs in this process; its CPU is not counted.
The host's other load changes the figures: compare rows of one run, or runs back to back.

    python benchmarks/request_cost.py --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordinator_load import (  # noqa: E402  (the benchmark's own helpers: database, servers, /proc CPU)
    FLEET_REPORTS,
    cpu_seconds,
    cpu_used,
    drop_database,
    fresh_database,
    process_tree,
    start_servers,
)

ROUTES = ("heartbeat", "heartbeat-unseen", "lease-empty", "lease", "result")
WARM = 50  # heartbeat-unseen: requests that fill the second process's connection pool, not measured


def server_cpu(pid: int) -> dict[int, float]:
    """User + system CPU of ``pid`` and the processes under it (uvicorn's workers, the background
    process), from /proc."""
    return cpu_seconds(process_tree(pid))


class Client:
    def __init__(self, http: aiohttp.ClientSession, base: str, admin: str) -> None:
        self.http, self.base, self.admin = http, base, admin

    async def post(self, path: str, body: Any, token: str) -> tuple[int, Any]:
        async with self.http.post(f"{self.base}/api/v1{path}", json=body,
                                  headers={"Authorization": f"Bearer {token}"}) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)

    async def enroll(self, i: int) -> str:
        status, minted = await self.post("/enroll-tokens", {}, self.admin)
        assert status == 201, minted
        info = {"enrollment_token": minted["token"], "name": f"cost-{i}", "chip": "NVIDIA H100 80GB HBM3",
                "backend": "cuda", "os": "Linux", "mlx_version": "0.32.4"}
        async with self.http.post(f"{self.base}/api/v1/workers/enroll", json=info) as r:
            body = await r.json()
            assert r.status == 201, body
            return str(body["token"])

    async def queue(self, jobs: int, tag: str) -> None:
        """``jobs`` new rmsnorm jobs (or a few more), in campaigns of 64 shapes."""
        for c in range(0, jobs, 64):
            shapes = [f"{c + s + 1}x4096" for s in range(64)]
            campaign = {"name": f"cost-{tag}-{c}", "kernels": ["rmsnorm"], "shapes": shapes,
                        "dtypes": ["float16"]}
            status, body = await self.post("/campaigns", campaign, self.admin)
            assert status == 201, body


async def timed(pid: int, label: str, calls: list[Any], concurrency: int) -> dict[str, Any]:
    """Run the coroutine factories ``calls`` ``concurrency`` at a time; CPU and latency per call."""
    queue = list(reversed(calls))
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def drain() -> None:
        while queue:
            call = queue.pop()
            t0 = time.perf_counter()
            status = await call()
            latencies.append(time.perf_counter() - t0)
            statuses[status] = statuses.get(status, 0) + 1

    cpu0, t0 = server_cpu(pid), time.perf_counter()
    await asyncio.gather(*(drain() for _ in range(concurrency)))
    cpu, wall = cpu_used(cpu0, server_cpu(pid)), time.perf_counter() - t0
    n = len(calls)
    return {"route": label, "requests": n, "statuses": statuses, "cpu_ms": 1e3 * cpu / n,
            "req_s": n / wall, "p50_ms": 1e3 * statistics.median(latencies),
            "server_cpu_share": cpu / wall}


@contextmanager
def serving(args: argparse.Namespace, url: str, admin: str, workdir: Path) -> Iterator[tuple[int, str]]:
    """One ``kernelfleet serve`` process on ``url``: (its pid, its base URL), once it answers."""
    (proc, port), = start_servers(args, url, admin, workdir)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        yield proc.pid, base
    finally:
        proc.terminate()
        proc.wait(30)


async def run(args: argparse.Namespace, base: str, admin: str, pid: int,
              second: Callable[[], AbstractContextManager[tuple[int, str]]]) -> list[dict[str, Any]]:
    reports = [json.loads(line) for line in FLEET_REPORTS.read_text().splitlines() if line.strip()][:8]
    rows = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency + 4)) as http:
        client = Client(http, base, admin)
        tokens = [await client.enroll(i) for i in range(args.workers)]
        await client.queue(args.workers, "held")
        # every queued job leased (round-robin), so that an idle poll finds nothing
        held: list[tuple[str, dict[str, Any]]] = []
        while True:
            token = tokens[len(held) % len(tokens)]
            status, got = await client.post("/leases", {}, token)
            if status == 204:
                break
            assert status == 200, got
            held.append((token, got))
        per = max(1, args.requests // len(held))

        def beat(token: str, job: dict[str, Any]) -> Any:
            async def call() -> int:
                return (await client.post(f"/jobs/{job['job_id']}/heartbeat",
                                          {"lease_token": job["lease_token"]}, token))[0]
            return call

        def poll(token: str) -> Any:
            async def call() -> int:
                return (await client.post("/leases", {"wait_seconds": 0}, token))[0]
            return call

        for _ in range(args.rounds):
            if "heartbeat" in args.routes:
                rows.append(await timed(pid, "heartbeat", [beat(t, j) for t, j in held] * per,
                                        args.concurrency))
            if "heartbeat-unseen" in args.routes:
                if len(held) <= WARM:
                    raise SystemExit(f"heartbeat-unseen: enroll more than {WARM} workers (--workers)")
                with second() as (pid2, base2):  # a fresh process each round: no token seen there yet
                    other = Client(http, base2, admin)

                    def beat2(token: str, job: dict[str, Any], other: Client = other) -> Any:
                        async def call() -> int:
                            return (await other.post(f"/jobs/{job['job_id']}/heartbeat",
                                                     {"lease_token": job["lease_token"]}, token))[0]
                        return call

                    await timed(pid2, "warm", [beat2(t, j) for t, j in held[:WARM]], args.concurrency)
                    rows.append(await timed(pid2, "heartbeat-unseen",
                                            [beat2(t, j) for t, j in held[WARM:WARM + args.requests]],
                                            args.concurrency))
            if "lease-empty" in args.routes:
                rows.append(await timed(pid, "lease-empty", [poll(t) for t, _ in held] * per,
                                        args.concurrency))
        if "lease" in args.routes or "result" in args.routes:
            n = args.requests
            await client.queue(n, "run")
            leased: list[tuple[str, dict[str, Any]]] = []

            def take(token: str) -> Any:
                async def call() -> int:
                    status, got = await client.post("/leases", {}, token)
                    if status == 200:
                        leased.append((token, got))
                    return status
                return call

            row = await timed(pid, "lease", [take(tokens[i % len(tokens)]) for i in range(n)],
                              args.concurrency)
            if "lease" in args.routes:
                rows.append(row)

            def report(i: int, token: str, job: dict[str, Any]) -> Any:
                body = dict(reports[i % len(reports)])
                body.update(kernel=job["kernel"], shape=job["shape"], dtype=job["dtype"])
                body["env"] = dict(body["env"], chip="NVIDIA H100 80GB HBM3", backend="cuda")

                async def call() -> int:
                    return (await client.post(f"/jobs/{job['job_id']}/result",
                                              {"lease_token": job["lease_token"], "report": body}, token))[0]
                return call

            if "result" in args.routes:
                rows.append(await timed(pid, "result", [report(i, t, j) for i, (t, j) in enumerate(leased)],
                                        args.concurrency))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--postgres", help="PostgreSQL server URL (a fresh database is made there); else SQLite")
    p.add_argument("--workers", type=int, default=50, help="enrolled workers, each holding one lease")
    p.add_argument("--requests", type=int, default=2000, help="requests per route and round")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the heartbeat and idle-poll routes")
    p.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    args = p.parse_args(argv)
    # the servers' options coordinator_load's start_servers reads
    args.lease_seconds, args.replicas, args.server_workers = 600.0, 1, 1
    os.environ["KERNELFLEET_LEASE_CONFIRM_SECONDS"] = "3600"  # leased jobs stay leased until their result
    admin = "kfa_" + secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url, name = fresh_database(args, workdir)
        try:
            env = dict(os.environ, KERNELFLEET_DATABASE_URL=url)
            subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", "db", "upgrade"], env=env,
                           check=True, capture_output=True)
            with serving(args, url, admin, workdir) as (pid, base):
                rows = asyncio.run(run(args, base, admin, pid, lambda: serving(args, url, admin, workdir)))
        finally:
            drop_database(args, name)
    load = os.getloadavg()
    print(f"server CPU per request ({'PostgreSQL' if args.postgres else 'SQLite'}, {args.concurrency} in "
          f"flight, load average {load[0]:.1f})")
    print(f"{'route':16} {'requests':>8} {'CPU ms':>7} {'req/s':>7} {'p50 ms':>7} {'server CPU':>10}  "
          "statuses")
    for r in rows:
        print(f"{r['route']:16} {r['requests']:8d} {r['cpu_ms']:7.2f} {r['req_s']:7.0f} {r['p50_ms']:7.1f} "
              f"{100 * r['server_cpu_share']:9.0f}%  {r['statuses']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
