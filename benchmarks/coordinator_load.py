"""Coordinator load: N simulated workers through the public API only, as the agent does.

Each simulated worker enrolls (an admin-minted enrollment token), then loops: lease (long-polled,
``--lease-wait``), confirm the lease at once with a heartbeat, "tune" for a think time drawn from
``--think``, heartbeating when the coordinator's answer says (as the agent: at most every lease_seconds/3,
spread by its jitter), and post a real-size report (the largest one in
benchmarks/results/h100_session_tuning.jsonl, with kernel, shape and dtype set to the job's). On a
204 it waits the coordinator's ``Retry-After`` (jittered). At the end it releases what it holds.
Workers start spread over ``--ramp`` seconds, and a worker's first job takes a uniform fraction of
its think time, as in a fleet already running (results flow from the start at the steady rate).

The coordinator runs as ``--replicas`` process groups (``kernelfleet serve --workers W`` each, on
one fresh database); simulated workers are spread over the replicas round-robin, or all sent
through nginx running the committed deploy/nginx.conf (``--nginx``). The client is asyncio +
aiohttp with one bounded connection pool (``--connections``): on the 2-core host httpx's
AsyncClient cost 3.5-8 ms of client CPU per request, aiohttp about 1 ms.

Printed: per-endpoint p50/p99/max and counts, jobs/s, errors, lost leases (a heartbeat or result
answered 409: a live worker's lease expired), the coordinator's own p99 of lease, heartbeat and
result (its request-duration histogram from ``/metrics``, scraped at the window's start, middle and
end: a bucket's bound), the load generator's CPU and event-loop lag, and the CPU of the coordinator
processes, of PostgreSQL and of the host. Then an audit of the database:
no job leased twice at once (the client's lease intervals per job never overlap, and each stored
result is the holder's), none done twice, every acknowledged result stored.

    python benchmarks/coordinator_load.py --postgres postgresql://postgres@127.0.0.1:5432/test \\
        --workers 1000 --duration 120 --think 30 60

``--scenario realistic`` (issue 33) is the fleet the coordinator meets: 8 chip kinds (5 Apple on
Metal, 3 NVIDIA on CUDA; worker i is chip i mod 8), each result one of the real reports of the H100
fleet run (benchmarks/results/h100_fleet_tuning.jsonl, about 40 KB each) with its chip and the
job's kernel, shape and dtype, and every job a new series (each campaign tunes new shapes).
``--readers N --reader-route /api/v1/profiles`` adds N unauthenticated readers beside the workers,
each reading the route back to back. ``--db-latency MS`` puts PostgreSQL that many milliseconds a round
trip away from the coordinator (``latency_proxy.py``; the load generator's own setup and audit talk to it
directly), as a managed database on another host would be. p99 is printed for each half of the window
too, so that growth (stored data, a background build that grows with it) shows.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import re
import resource
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import func, select

from kernelfleet.service.auth import digest
from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Job, JobState, Result
from kernelfleet.worker.agent import next_interval

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "benchmarks" / "results" / "h100_session_tuning.jsonl"
FLEET_REPORTS = ROOT / "benchmarks" / "results" / "h100_fleet_tuning.jsonl"  # --scenario realistic
CHIP, BACKEND = "NVIDIA H100 80GB HBM3", "cuda"
# --scenario realistic: 5 Apple chips (Metal), 3 NVIDIA (CUDA)
FLEET_CHIPS = [("Apple M1", "metal"), ("Apple M2 Pro", "metal"), ("Apple M3 Max", "metal"),
               ("Apple M4", "metal"), ("Apple M4 Max", "metal"), ("NVIDIA H100 80GB HBM3", "cuda"),
               ("NVIDIA H200", "cuda"), ("NVIDIA A100-SXM4-80GB", "cuda")]
KERNELS = ["rmsnorm", "layernorm", "softmax", "logsumexp"]
DTYPES = ["float32", "float16", "bfloat16"]


# ---------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_database(args: argparse.Namespace, workdir: Path) -> tuple[str, str | None]:
    """A new, empty database URL (and its PostgreSQL name, to drop afterwards)."""
    if not args.postgres:
        return f"sqlite:///{workdir / 'kernelfleet.db'}", None
    import psycopg

    name = "kf_load_" + secrets.token_hex(4)
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return args.postgres.rsplit("/", 1)[0] + "/" + name, name


def start_latency_proxy(args: argparse.Namespace, url: str) -> tuple[subprocess.Popen[str], str, float]:
    """``--db-latency``: a proxy (``latency_proxy.py``) adding that many ms to each round trip between
    the coordinator and PostgreSQL, the database URL through it, and a SELECT 1's ms through it."""
    from sqlalchemy.engine import make_url

    direct, port = make_url(url), free_port()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "latency_proxy.py"), "--port", str(port),
           "--to", f"{direct.host or '127.0.0.1'}:{direct.port or 5432}", "--ms", str(args.db_latency)]
    proxy = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proxy.stdout is not None
    if not proxy.stdout.readline().startswith("listening"):
        raise SystemExit("the latency proxy did not start")
    proxied = direct.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    import psycopg

    with psycopg.connect(proxied.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        trips = []
        for _ in range(20):
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            trips.append(time.perf_counter() - t0)
    return proxy, proxied, 1e3 * statistics.median(trips)


def drop_database(args: argparse.Namespace, name: str | None) -> None:
    if name:
        import psycopg

        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_servers(args: argparse.Namespace, url: str, admin: str, workdir: Path) -> list[tuple[Any, int]]:
    env = dict(os.environ, KERNELFLEET_DATABASE_URL=url, KERNELFLEET_ADMIN_TOKEN=admin,
               KERNELFLEET_LEASE_SECONDS=str(args.lease_seconds), PYTHONUNBUFFERED="1")
    servers = []
    for i in range(args.replicas):
        port = free_port()
        log = open(workdir / f"server-{i}.log", "wb")  # noqa: SIM115 - lives as long as the server
        cmd = [sys.executable, "-m", "kernelfleet.worker.cli", "serve", "--port", str(port),
               "--workers", str(args.server_workers), "--log-level", "warning"]
        servers.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True), port))
    return servers


def start_profiler(args: argparse.Namespace, pids: list[int]) -> Any:
    """py-spy sampling the coordinator processes (and their children) for the measured window."""
    if not args.profile:
        return None
    # --gil: only the thread holding the GIL (what costs the process CPU); --nonblocking: never pause it
    cmd = [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw", "--rate", "100",
           "--gil", "--nonblocking", "--subprocesses", "--duration", str(int(args.duration)),
           "--output", str(args.profile)]
    if len(pids) != 1:  # py-spy takes one --pid
        raise SystemExit("--profile samples one replica: use it with --replicas 1")
    return subprocess.Popen([*cmd, "--pid", str(pids[0])], stdout=subprocess.DEVNULL, start_new_session=True)


def start_nginx(ports: list[int], workdir: Path) -> tuple[Any, int]:
    """nginx with the committed deploy/nginx.conf, its upstream pointed at this host's replicas."""
    port = free_port()
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    servers = "".join(f"        server 127.0.0.1:{p} max_fails=3 fail_timeout=5s;\n" for p in ports)
    conf = re.sub(r"( *server coordinator-\S+ [^\n]*\n)+", servers, conf)
    conf = conf.replace("listen 8600;", f"listen 127.0.0.1:{port};")
    (workdir / "nginx.conf").write_text(conf)
    log = open(workdir / "nginx.log", "wb")  # noqa: SIM115 - lives as long as nginx
    main = f"daemon off; pid {workdir / 'nginx.pid'}; error_log {workdir / 'nginx-error.log'};"
    proc = subprocess.Popen(["nginx", "-p", str(workdir), "-c", str(workdir / "nginx.conf"), "-g", main],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port


def process_tree(pid: int) -> list[int]:
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            for child in children:
                out += process_tree(int(child))
    except OSError:
        pass
    return out


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two samples (processes that started in between count from zero)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def process_shares(before: dict[int, float], after: dict[int, float], wall: float) -> list[tuple[str, float]]:
    """CPU share of one core per kind of coordinator process: server, background, ..."""
    shares: dict[str, float] = defaultdict(float)
    for pid, t in after.items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            cmdline, comm = b"", ""
        # serve's background process names itself (service/background.py); uvicorn's worker
        # processes (serve --workers N) are spawned by multiprocessing too
        name = ("background" if comm == "kf-background" else
                "multiprocessing tracker" if b"resource_tracker" in cmdline else
                "nginx" if b"nginx" in cmdline else "server")
        shares[name] += (t - before.get(pid, 0.0)) / wall
    return sorted(shares.items(), key=lambda kv: -kv[1])


def postgres_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == "postgres":
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def host_busy() -> tuple[float, float]:
    values = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


# ---------------------------------------------------------------------------- the simulated fleet

@dataclass
class Stats:
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    at: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # when each was measured
    reads: Counter[int] = field(default_factory=Counter)  # readers' statuses
    errors: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    acked: list[tuple[int, int, int, str]] = field(default_factory=list)  # job, result, worker, token
    holds: dict[int, list[tuple[float, float, int]]] = field(default_factory=lambda: defaultdict(list))
    lags: list[float] = field(default_factory=list)
    db_waits: Counter[str] = field(default_factory=Counter)  # connection states summed over samples
    db_samples: int = 0


class Fleet:
    def __init__(self, args: argparse.Namespace, bases: list[str], admin: str,
                 reports: list[dict[str, Any]]) -> None:
        self.args, self.bases, self.admin, self.reports = args, bases, admin, reports
        self.stats = Stats()
        self.stop = asyncio.Event()
        self.measuring = False

    async def call(self, http: aiohttp.ClientSession, name: str, method: str, url: str,
                   **kw: Any) -> tuple[int, Any, dict[str, str]]:
        t0 = time.monotonic()
        try:
            async with http.request(method, url, **kw) as r:
                raw = await r.read()
                body = json.loads(raw) if r.status in (200, 201) and name != "read" else None
                status, headers = r.status, dict(r.headers)
        except (aiohttp.ClientError, TimeoutError) as e:
            self.stats.errors[f"{name}: {type(e).__name__}"] += 1
            return 0, None, {}
        if self.measuring:
            self.stats.latency[name].append(time.monotonic() - t0)
            self.stats.at[name].append(t0)
        if name == "read":
            self.stats.reads[status] += 1
            return status, body, headers
        if status >= 500 or status not in (200, 201, 204, 409):
            self.stats.errors[f"{name}: {status}"] += 1
        return status, body, headers

    async def enroll(self, http: aiohttp.ClientSession, base: str, i: int) -> tuple[int, str]:
        admin = {"Authorization": f"Bearer {self.admin}"}
        for _ in range(20):
            status, minted, _ = await self.call(http, "enroll-token", "POST",
                                                f"{base}/api/v1/enroll-tokens", json={}, headers=admin)
            if status == 201:
                chip, backend = self.chip(i)
                info = {"enrollment_token": minted["token"], "name": f"sim-{i}", "chip": chip,
                        "backend": backend, "os": "Linux", "mlx_version": "0.32.4"}
                status, body, _ = await self.call(http, "enroll", "POST",
                                                  f"{base}/api/v1/workers/enroll", json=info)
                if status == 201:
                    return int(body["worker_id"]), str(body["token"])
            await asyncio.sleep(1.0)
        raise RuntimeError(f"simulated worker {i} could not enroll")

    def chip(self, i: int) -> tuple[str, str]:
        return FLEET_CHIPS[i % len(FLEET_CHIPS)] if self.args.scenario == "realistic" else (CHIP, BACKEND)

    async def reader(self, http: aiohttp.ClientSession, i: int) -> None:
        """An unauthenticated reader of --reader-route, back to back (a 503's Retry-After honoured)."""
        base = self.bases[i % len(self.bases)]
        while not self.stop.is_set():
            status, _, headers = await self.call(http, "read", "GET", base + self.args.reader_route)
            if status == 503:
                await self._sleep(float(headers.get("Retry-After", 1)))

    async def worker(self, http: aiohttp.ClientSession, i: int, ident: tuple[int, str]) -> None:
        base = self.bases[i % len(self.bases)]
        worker_id, token = ident
        auth = {"Authorization": f"Bearer {token}"}
        rng = random.Random(i)
        await asyncio.sleep(rng.uniform(0, self.args.ramp))
        first = True
        while not self.stop.is_set():
            status, lease, headers = await self.call(
                http, "lease", "POST", f"{base}/api/v1/leases", json={"wait_seconds": self.args.lease_wait},
                headers=auth)
            if status != 200:
                retry = float(headers.get("Retry-After", 5)) if status == 204 else 5.0
                await self._sleep(retry * rng.uniform(0.75, 1.25))
                continue
            start = time.monotonic()
            job_url = f"{base}/api/v1/jobs/{lease['job_id']}"
            body = {"lease_token": lease["lease_token"]}
            held = await self._hold(http, job_url, body, auth, rng, lease["lease_seconds"], first)
            first = False
            if held == "done":
                chip, backend = self.chip(i)
                base_report = rng.choice(self.reports)
                report = dict(base_report, kernel=lease["kernel"], shape=lease["shape"], dtype=lease["dtype"],
                              env=dict(base_report["env"], chip=chip, backend=backend))
                status, answer, _ = await self.call(http, "result", "POST", f"{job_url}/result",
                                                    json={**body, "report": report}, headers=auth)
                if status in (200, 201):
                    self.stats.acked.append((lease["job_id"], answer["result_id"], worker_id,
                                             lease["lease_token"]))
                elif status == 409:
                    self.stats.lost += 1
            elif held == "stopped":
                await self.call(http, "release", "POST", f"{job_url}/release", json=body, headers=auth)
            self.stats.holds[lease["job_id"]].append((start, time.monotonic(), worker_id))

    async def _hold(self, http: aiohttp.ClientSession, job_url: str, body: dict[str, str],
                    auth: dict[str, str], rng: random.Random, lease_seconds: float, first: bool) -> str:
        """Confirm, then heartbeat while "tuning", when the coordinator's answer says as the agent does
        (``next_interval``: at most lease/3, less its spreading jitter): done, lost or stopped."""
        think = rng.uniform(*self.args.think)
        if first:  # the fleet is in steady state: a worker is somewhere in its current tune
            think = rng.uniform(0, think)
        tune_until = time.monotonic() + think
        while True:
            status, reply, _ = await self.call(http, "heartbeat", "POST", f"{job_url}/heartbeat", json=body,
                                               headers=auth)
            if status == 409:
                self.stats.lost += 1
                return "lost"
            pause = min(next_interval(reply, lease_seconds / 3), tune_until - time.monotonic())
            if pause <= 0:
                return "done"
            if await self._sleep(pause):
                return "stopped"

    async def _sleep(self, seconds: float) -> bool:
        """Sleep, or return True at once when the run stops."""
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
            return True
        except TimeoutError:
            return False

    async def watch_database(self, url: str) -> None:
        """Sample pg_stat_activity of the run's database: are connections waiting on locks?"""
        import psycopg

        plain = url.replace("postgresql+psycopg://", "postgresql://")
        query = ("SELECT state || coalesce(' (' || wait_event_type || ')', ''), count(*) "
                 "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                 "GROUP BY 1")
        with psycopg.connect(plain, autocommit=True) as conn:
            while not self.stop.is_set():
                if self.measuring:
                    for what, n in await asyncio.to_thread(lambda: conn.execute(query).fetchall()):
                        self.stats.db_waits[str(what)] += n
                    self.stats.db_samples += 1
                await asyncio.sleep(1.0)

    async def watch_lag(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            await asyncio.sleep(0.1)
            if self.measuring:
                self.stats.lags.append(time.monotonic() - t0 - 0.1)


# the coordinator's own timing of a request (service/metrics.py: from its outermost middleware to the end of
# the response, every process summed by /metrics): a p99 far below the load generator's says the time is
# spent before the request reaches the app (the client's loop, its connection pool, the server's accept
# queue and event loop), one as high says inside it
SERVER_LATENCY = "kernelfleet_http_request_duration_seconds"
SERVER_ROUTES = {"lease": "/api/v1/leases", "heartbeat": "/api/v1/jobs/{job_id}/heartbeat",
                 "result": "/api/v1/jobs/{job_id}/result"}
Buckets = dict[str, dict[float, float]]  # route template -> bucket bound -> cumulative count


async def server_buckets(http: aiohttp.ClientSession, base: str, admin: str) -> Buckets:
    """The coordinator's request-duration histogram now, per route template (methods summed)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"{base}/metrics", headers={"authorization": f"Bearer {admin}"}) as r:
        text = await r.text()
    out: Buckets = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        if family.name == SERVER_LATENCY:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    le, route = float(sample.labels["le"]), sample.labels["route"]
                    out[route][le] = out[route].get(le, 0.0) + sample.value
    return out


def bucket_quantile(before: Buckets, after: Buckets, route: str, q: float) -> tuple[float, int]:
    """The smallest bucket bound holding ``q`` of the route's requests between two scrapes (an upper
    bound on that quantile; inf past the last bucket), and their number."""
    now, then = after.get(route, {}), before.get(route, {})
    counts = sorted((le, n - then.get(le, 0.0)) for le, n in now.items())
    total = counts[-1][1] if counts else 0.0
    for le, n in counts:
        if total and n >= q * total:
            return le, int(total)
    return math.inf, int(total)


def server_line(scrapes: Sequence[Buckets]) -> str:
    """p99 by the coordinator's own timing: the window, then its two halves (scrapes at start, middle,
    end)."""
    def bound(le: float) -> str:
        return "past the last bucket" if math.isinf(le) else f"<= {le * 1e3:g} ms"

    parts = []
    for name, route in SERVER_ROUTES.items():
        whole, n = bucket_quantile(scrapes[0], scrapes[-1], route, 0.99)
        if n:
            halves = [bucket_quantile(a, b, route, 0.99)[0] for a, b in itertools.pairwise(scrapes)]
            parts.append(f"{name} p99 {bound(whole)} ({n} requests; halves "
                         f"{' / '.join(map(bound, halves))})")
    return "coordinator's own timing (its request-duration histogram's buckets): " + "; ".join(parts)


async def create_jobs(http: aiohttp.ClientSession, base: str, admin: str, jobs: int) -> int:
    made = 0
    for c in range(10_000):
        if made >= jobs:
            return made
        shapes = [f"{64 * c + r + 1}x4096" for r in range(64)]
        body = {"name": f"load-{c}", "kernels": KERNELS, "shapes": shapes, "dtypes": DTYPES}
        async with http.post(f"{base}/api/v1/campaigns", json=body,
                             headers={"Authorization": f"Bearer {admin}"}) as r:
            assert r.status == 201, await r.text()
        made += len(KERNELS) * len(shapes) * len(DTYPES)
    return made


# ---------------------------------------------------------------------------- audit and report

def audit(url: str, stats: Stats) -> list[str]:
    lines, problems = [], 0
    for job, holds in stats.holds.items():
        holds.sort()
        for (_, end, _), (start, _, _) in zip(holds, holds[1:], strict=False):
            if start < end:
                problems += 1
                lines.append(f"  job {job} was held by two workers at once: {holds}")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            stored = {r.job_id: r for r in conn.execute(
                select(Result.job_id, Result.id, Result.worker_id, Result.lease_token)
                .where(Result.source == "lease"))}
            per_job = conn.execute(select(func.count(), func.count(func.distinct(Result.job_id)))
                                   .where(Result.source == "lease")).one()
            done = conn.scalar(select(func.count()).select_from(Job).where(Job.state == JobState.done))
            leased = conn.scalar(select(func.count()).select_from(Job).where(Job.state == JobState.leased))
    finally:
        engine.dispose()
    missing = [a for a in stats.acked if (r := stored.get(a[0])) is None or
               (r.id, r.worker_id, r.lease_token) != (a[1], a[2], digest(a[3]))]
    lines.append(f"audit: {len(stats.acked)} results acknowledged, {per_job[0]} stored for {per_job[1]} "
                 f"jobs, {done} jobs done, {leased} still leased after the run")
    lines.append(f"audit: jobs held by two workers at once: {problems}; done twice: "
                 f"{per_job[0] - per_job[1]}; acknowledged but not stored as acknowledged: {len(missing)}")
    ok = not problems and per_job[0] == per_job[1] == done and not missing
    lines.append("audit: OK" if ok else "audit: FAILED")
    return lines


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


WAVE_BUCKET_S = 10.0


def buckets(latency: list[float], at: list[float], start: float, wall: float,
            width: float = WAVE_BUCKET_S) -> list[list[float]]:
    """The latencies of the requests sent in each ``width``-second slice of the window."""
    out: list[list[float]] = [[] for _ in range(max(1, int(wall // width)))]
    for value, when in zip(latency, at, strict=True):
        i = int((when - start) // width)
        if 0 <= i < len(out):
            out[i].append(value)
    return out


def waves(name: str, latency: list[float], at: list[float], start: float, wall: float) -> str:
    """A line on how evenly ``name`` requests arrive: their count per 10 s slice (min, median, max: a
    fleet whose heartbeats lined up arrives in waves, max far above median) and the worst slice's p99."""
    slices = buckets(latency, at, start, wall)
    counts = [len(b) for b in slices]
    median = statistics.median(counts)
    worst = max((pct(b, 0.99) for b in slices if len(b) >= 20), default=float("nan"))
    ratio = f"{max(counts) / median:.2f}" if median else "-"
    return (f"{name} per {WAVE_BUCKET_S:.0f} s: min {min(counts)}, median {median:.0f}, max {max(counts)} "
            f"(max/median {ratio}); the worst slice's p99 {worst * 1e3:.1f} ms")


async def run(args: argparse.Namespace) -> list[str]:
    workdir = Path(tempfile.mkdtemp(prefix="kf-load-"))
    url, pg_name = fresh_database(args, workdir)
    subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", "db", "upgrade", "--database-url", url],
                   check=True, capture_output=True)
    admin = "adm-" + secrets.token_urlsafe(24)
    proxy, served_url, trip_ms = start_latency_proxy(args, url) if args.db_latency else (None, url, 0.0)
    servers = start_servers(args, served_url, admin, workdir)
    if args.nginx:
        lb, lb_port = start_nginx([port for _, port in servers], workdir)
        servers.append((lb, lb_port))
    bases = ([f"http://127.0.0.1:{servers[-1][1]}"] if args.nginx else
             [f"http://127.0.0.1:{port}" for _, port in servers])
    if args.scenario == "realistic":
        reports = [json.loads(line) for line in FLEET_REPORTS.read_text().splitlines() if line.strip()]
    else:
        reports = [max((json.loads(line) for line in REPORTS.read_text().splitlines()),
                       key=lambda r: len(json.dumps(r)))]
    connector = aiohttp.TCPConnector(limit=args.connections)
    timeout = aiohttp.ClientTimeout(total=args.lease_wait + 60)
    fleet = Fleet(args, bases, admin, reports)
    out: list[str] = []
    spy = None
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            for base in {f"http://127.0.0.1:{port}" for _, port in servers}:
                for _ in range(600):
                    try:
                        async with http.get(f"{base}/healthz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
            jobs = await create_jobs(http, bases[0], admin, args.jobs)
            sem = asyncio.Semaphore(64)

            async def enroll(i: int) -> tuple[int, str]:
                async with sem:
                    return await fleet.enroll(http, bases[i % len(bases)], i)

            t_enroll = time.monotonic()
            idents = await asyncio.gather(*(enroll(i) for i in range(args.workers)))
            out.append(f"enrolled {args.workers} workers in {time.monotonic() - t_enroll:.0f} s; "
                       f"{jobs} jobs queued")
            pids = [p for proc, _ in servers for p in process_tree(proc.pid)]
            spy = start_profiler(args, [proc.pid for proc, _ in servers])
            lag = asyncio.create_task(fleet.watch_lag())
            watch = asyncio.create_task(fleet.watch_database(url)) if args.postgres else None
            tasks = [asyncio.create_task(fleet.worker(http, i, idents[i])) for i in range(args.workers)]
            tasks += [asyncio.create_task(fleet.reader(http, i)) for i in range(args.readers)]
            fleet.measuring = True
            cpu0, pg0, host0 = cpu_seconds(pids), cpu_seconds(postgres_pids()), host_busy()
            me0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            acked0 = 0
            scrapes = [await server_buckets(http, bases[0], admin)]
            await asyncio.sleep(max(0.0, t0 + args.duration / 2 - time.monotonic()))
            scrapes.append(await server_buckets(http, bases[0], admin))
            await asyncio.sleep(max(0.0, t0 + args.duration - time.monotonic()))
            scrapes.append(await server_buckets(http, bases[0], admin))
            wall = time.monotonic() - t0
            me1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu1, pg1, host1 = cpu_seconds(pids), cpu_seconds(postgres_pids()), host_busy()
            shares = process_shares(cpu0, cpu1, wall)  # while the processes (and their names) exist
            load = os.getloadavg()
            acked = len(fleet.stats.acked) - acked0
            fleet.measuring = False
            fleet.stop.set()
            await asyncio.gather(*tasks)
            lag.cancel()
            if watch is not None:
                await watch
    finally:
        if spy is not None:
            spy.wait()
        for proc, _ in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in servers:
            proc.wait(timeout=30)
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=10)
    s = fleet.stats
    away = (f" {args.db_latency:g} ms a round trip away (latency_proxy.py; SELECT 1 through it: "
            f"{trip_ms:.1f} ms)" if args.db_latency else "")
    out.append(f"{args.workers} workers, think {args.think[0]:g}-{args.think[1]:g} s, "
               f"lease {args.lease_seconds:g} s (heartbeat at most every {args.lease_seconds / 3:g} s, "
               f"when the coordinator says), "
               f"long-poll {args.lease_wait:g} s, "
               f"{args.replicas} replica(s) x {args.server_workers} process(es), "
               f"{'through nginx' if args.nginx else 'direct'}, {args.connections} client connections, "
               f"{'PostgreSQL' if args.postgres else 'SQLite'}{away}; measured {wall:.0f} s")
    if args.scenario == "realistic":
        sizes = sorted(len(json.dumps(r)) for r in reports)
        out.append(f"scenario realistic: {len(FLEET_CHIPS)} chip kinds, {len(reports)} reports of "
                   f"{FLEET_REPORTS.name} ({sizes[0] / 1e3:.0f}-{sizes[-1] / 1e3:.0f} KB, median "
                   f"{statistics.median(sizes) / 1e3:.0f} KB), a new series per job")
    if args.readers:
        out.append(f"{args.readers} unauthenticated readers of {args.reader_route}: statuses "
                   f"{dict(sorted(s.reads.items()))}")
    out.append(f"{'endpoint':12s} {'count':>7s} {'req/s':>7s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} "
               f"{'p99 1st half':>13s} {'p99 2nd half':>13s}")
    for name in ("lease", "heartbeat", "result", "release", "read"):
        v = s.latency.get(name, [])
        if v:
            mid = t0 + wall / 2
            halves = [[x for x, at in zip(v, s.at[name], strict=True) if (at < mid) == first]
                      for first in (True, False)]
            p99s = [f"{pct(h, 0.99) * 1e3:13.1f}" if h else f"{'-':>13s}" for h in halves]
            out.append(f"{name:12s} {len(v):7d} {len(v) / wall:7.1f} {statistics.median(v) * 1e3:8.1f} "
                       f"{pct(v, 0.99) * 1e3:8.1f} {max(v) * 1e3:8.1f} {' '.join(p99s)}")
    for name in ("lease", "heartbeat"):
        if s.latency.get(name):
            out.append(waves(name, s.latency[name], s.at[name], t0, wall))
    if s.latency.get("heartbeat") and wall - args.ramp >= 2 * WAVE_BUCKET_S:
        # while workers start, each new lease's confirming heartbeat comes on top of the running ones':
        # after the ramp only the running ones beat, and waves of theirs would show here
        late = [(v, at) for v, at in zip(s.latency["heartbeat"], s.at["heartbeat"], strict=True)
                if at >= t0 + args.ramp]
        out.append(waves(f"heartbeat after the {args.ramp:g} s ramp", [v for v, _ in late],
                         [at for _, at in late], t0 + args.ramp, wall - args.ramp))
    out.append(server_line(scrapes))
    out.append(f"jobs/s: {acked / wall:.2f} ({acked} results acknowledged in the window)")
    out.append(f"errors: {sum(s.errors.values())} {dict(s.errors) if s.errors else ''}".rstrip())
    out.append(f"lost leases (409 on a heartbeat or result of a live worker): {s.lost}")
    client_cpu = (me1.ru_utime - me0.ru_utime + me1.ru_stime - me0.ru_stime) / wall
    out.append(f"load generator: CPU {client_cpu:.0%} of one core; event-loop lag p50 "
               f"{statistics.median(s.lags) * 1e3:.1f} ms, p99 {pct(s.lags, 0.99) * 1e3:.1f} ms, "
               f"max {max(s.lags) * 1e3:.1f} ms")
    per_process = ", ".join(f"{name} {share:.0%}" for name, share in shares)
    out.append(f"coordinator ({len(pids)} processes): CPU {cpu_used(cpu0, cpu1) / wall:.0%} of one core "
               f"({per_process}); "
               f"PostgreSQL (all backends on the host): {cpu_used(pg0, pg1) / wall:.0%}; host: "
               f"{(host1[0] - host0[0]) / (host1[1] - host0[1]):.0%} busy of {os.cpu_count()} cores, "
               f"load average {load[0]:.1f} (other engineers' jobs share this host)")
    if s.db_samples:
        states = ", ".join(f"{k} {v / s.db_samples:.1f}" for k, v in s.db_waits.most_common())
        out.append(f"database connections of the run, mean per 1 s sample: {states} (idle: pooled; "
                   f"idle in transaction: held by a busy coordinator thread; (Lock): waiting for a lock)")
    out += audit(url, s)
    drop_database(args, pg_name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--postgres", help="PostgreSQL server URL (a fresh database is made there); "
                                      "default: SQLite")
    p.add_argument("--workers", type=int, default=1000, help="simulated workers")
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds")
    p.add_argument("--ramp", type=float, default=30.0, help="workers start spread over this many seconds")
    p.add_argument("--think", type=float, nargs=2, default=(30.0, 60.0), metavar=("MIN", "MAX"),
                   help="seconds a simulated tune takes")
    p.add_argument("--lease-seconds", type=float, default=120.0)
    p.add_argument("--lease-wait", type=float, default=10.0, help="long-poll seconds per lease request")
    p.add_argument("--jobs", type=int, default=5000, help="jobs queued before the run")
    p.add_argument("--replicas", type=int, default=1, help="coordinator replicas (kernelfleet serve each)")
    p.add_argument("--server-workers", type=int, default=1, help="--workers of each replica")
    p.add_argument("--nginx", action="store_true",
                   help="put nginx with deploy/nginx.conf in front of the replicas (its CPU counts as "
                        "the server's)")
    p.add_argument("--connections", type=int, default=500, help="client connection pool size")
    p.add_argument("--scenario", choices=("simple", "realistic"), default="simple",
                   help="simple: one chip kind, the largest session report; realistic: 8 chip kinds "
                        "(5 Apple, 3 NVIDIA), the H100 fleet run's ~40 KB reports, a new series per job")
    p.add_argument("--readers", type=int, default=0, help="unauthenticated readers beside the workers")
    p.add_argument("--reader-route", default="/api/v1/profiles", help="what the readers read")
    p.add_argument("--profile", type=Path, help="sample the coordinator with py-spy (pip install py-spy) "
                                                "during the measured window; raw folded stacks to this file")
    p.add_argument("--db-latency", type=float, default=0.0, metavar="MS",
                   help="PostgreSQL: put the database this many ms a round trip away from the coordinator "
                        "(a proxy, benchmarks/latency_proxy.py)")
    p.add_argument("--out", type=Path, help="also write the summary to this file")
    args = p.parse_args()
    if args.db_latency and not args.postgres:
        p.error("--db-latency needs --postgres")
    lines = asyncio.run(run(args))
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(f"$ python benchmarks/coordinator_load.py {' '.join(sys.argv[1:])}\n{text}\n")


if __name__ == "__main__":
    main()
