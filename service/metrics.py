"""Prometheus metrics (``GET /metrics``, :mod:`kernelfleet.service.api.metrics`).

Kept while serving: requests by route template, method and status; latency histograms by route
template; leases granted; reaper passes. Computed at scrape time: jobs by state (one ``GROUP BY``
over ``jobs``), leases past their expiry that the reaper has not requeued yet, the reaper's lag
(seconds since its last pass), and the background work's queues (:mod:`kernelfleet.service.background`):
results waiting for their reactions and chips waiting for a profile build, with the age of the
oldest of each (the lag).

Labels use the route's template (``/api/v1/jobs/{job_id}/heartbeat``), never the raw path, and
requests that match no route share ``route="unmatched"``, so label values stay bounded.

With ``PROMETHEUS_MULTIPROC_DIR`` set (several server processes) every process writes its samples
there and a scrape of any process adds them up (prometheus_client's multiprocess mode); empty that
directory before the processes start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Receive, Scope, Send

from kernelfleet.service.asgi import HttpMiddleware, ResponseWatch
from kernelfleet.service.db import db_now
from kernelfleet.service.models import Job, JobState, ProfileRequest, ResultEvent
from kernelfleet.service.routes import template_of

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

REGISTRY = CollectorRegistry()  # this process's metrics (single-process mode)
if not os.environ.get(MULTIPROC_DIR_ENV):
    ProcessCollector(registry=REGISTRY)  # CPU, memory, open files (not available across processes)

REQUESTS = Counter("kernelfleet_http_requests", "HTTP requests by route template, method and status",
                   ["route", "method", "status"], registry=REGISTRY)
LATENCY = Histogram("kernelfleet_http_request_duration_seconds",
                    "Time from request to the end of the response, by route template and method",
                    ["route", "method"], registry=REGISTRY)
LEASES_GRANTED = Counter("kernelfleet_leases_granted", "Jobs leased to workers", registry=REGISTRY)
REAPED = Counter("kernelfleet_reaped_leases", "Expired leases the reaper moved, by the job's new state",
                 ["state"], registry=REGISTRY)
REAPER_LAST_PASS_NAME = "kernelfleet_reaper_last_pass_timestamp_seconds"
REAPER_LAST_PASS = Gauge(REAPER_LAST_PASS_NAME,
                         "Unix time of the reaper's last pass that reached the database",
                         multiprocess_mode="max", registry=REGISTRY)


def record_reaper_pass(moved_states: Iterable[str]) -> None:
    for state in moved_states:
        REAPED.labels(state).inc()
    REAPER_LAST_PASS.set(time.time())


class MetricsMiddleware(HttpMiddleware):
    """Counts and times every HTTP request under its route template."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch)
        finally:
            status = watch.status or 500  # no response: the server answers 500
            route = template_of(scope["app"], scope.get("route")) if "app" in scope else None
            route = route or UNMATCHED
            method = scope["method"] if scope["method"] in METHODS else "other"
            REQUESTS.labels(route, method, str(status)).inc()
            LATENCY.labels(route, method).observe(time.perf_counter() - start)


def render(session_factory: sessionmaker[Session]) -> bytes:
    """The Prometheus text exposition of everything above."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(session_factory))
    return generate_latest(registry)


class _Scrape:
    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.session_factory = session_factory

    def collect(self) -> Iterator[Metric]:
        path = os.environ.get(MULTIPROC_DIR_ENV)
        kept = list(MultiProcessCollector(None, path).collect() if path else REGISTRY.collect())
        yield from kept
        yield _reaper_lag(kept)
        yield from _job_gauges(self.session_factory)
        yield from _background_gauges(self.session_factory)


def _reaper_lag(families: list[Metric]) -> Metric:
    lag = GaugeMetricFamily("kernelfleet_reaper_lag_seconds",
                            "Seconds since the reaper's last pass (no sample before its first pass)")
    last = [s.value for f in families if f.name == REAPER_LAST_PASS_NAME for s in f.samples if s.value > 0]
    if last:
        lag.add_metric([], max(0.0, time.time() - max(last)))
    return lag


def _job_gauges(session_factory: sessionmaker[Session]) -> Iterator[Metric]:
    expired = case((Job.lease_expires_at < db_now(), 1), else_=0)
    with session_factory() as session:
        rows = session.execute(
            select(Job.state, func.count(), func.coalesce(func.sum(expired), 0)).group_by(Job.state)
        ).all()
    by_state = {JobState(state).value: (int(n), int(late)) for state, n, late in rows}
    jobs = GaugeMetricFamily("kernelfleet_jobs", "Jobs by state, counted at scrape time", labels=["state"])
    for state in JobState:
        jobs.add_metric([state.value], by_state.get(state.value, (0, 0))[0])
    yield jobs
    yield GaugeMetricFamily("kernelfleet_expired_leases",
                            "Leased jobs past their lease expiry, not yet requeued by the reaper",
                            value=by_state.get(JobState.leased.value, (0, 0))[1])


def _background_gauges(session_factory: sessionmaker[Session]) -> Iterator[Metric]:
    now = db_now()
    with session_factory() as session:
        queues = {
            "reactions": session.execute(select(func.count(), func.min(ResultEvent.created_at), now)).one(),
            "profiles": session.execute(select(func.count(func.distinct(ProfileRequest.chip)),
                                               func.min(ProfileRequest.created_at), now)).one(),
        }
    depth = GaugeMetricFamily("kernelfleet_background_queue",
                              "Background work waiting: results whose reactions (regression detection) "
                              "have not run, chips whose profile awaits a build", labels=["queue"])
    lag = GaugeMetricFamily("kernelfleet_background_lag_seconds",
                            "Age of the oldest waiting item of each background queue (0 when empty)",
                            labels=["queue"])
    for name, (count, oldest, clock) in queues.items():
        depth.add_metric([name], int(count or 0))
        age = 0.0
        if oldest is not None and clock is not None:
            if (oldest.tzinfo is None) != (clock.tzinfo is None):
                oldest, clock = oldest.replace(tzinfo=None), clock.replace(tzinfo=None)
            age = max(0.0, (clock - oldest).total_seconds())
        lag.add_metric([name], age)
    yield depth
    yield lag
