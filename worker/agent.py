"""The worker agent: enroll once, then lease, tune, report, forever; survive outages and signals.

One job at a time, on the main thread::

    start:  check the URL (GET /healthz), load or obtain the worker token, replay the spool
    loop:   spool not empty?  -> deliver it (jittered backoff while unreachable); lease nothing new
            lease a job       -> long-polled (--lease-wait); 204: idle for the coordinator's
                                 Retry-After (else --poll-seconds), jittered; unreachable: back off
            confirm it        -> one heartbeat at once: an unconfirmed lease goes back to the queue
            tune it           -> a heartbeat thread extends the lease every lease_seconds/3;
                                 a 409 on a heartbeat means the lease is lost: the tune is abandoned
                                 (checked at every progress step) and its result never posted
            spool the result  -> write, fsync, rename; then POST it with the lease token;
                                 2xx deletes it, 409/422 (terminal) quarantines it with the reason
            tuning error      -> POST /jobs/{id}/fail (spooled the same way)

Stopping: :meth:`Agent.request_stop` (SIGTERM/SIGINT) stops leasing; the current job may finish
within the grace period, else it is released (``/jobs/{id}/release``) and the agent exits 0. A
401 anywhere means this worker's token was revoked: stop cleanly with :class:`WorkerRevoked`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.worker.backoff import Backoff
from kernelfleet.worker.client import (
    CoordinatorClient,
    CoordinatorError,
    Idle,
    Lease,
    LeaseConflict,
    NotACoordinator,
    Rejected,
    Unauthorized,
    Unreachable,
)
from kernelfleet.worker.enrollment import AgentError, WorkerRevoked, authenticate, connect, machine_info
from kernelfleet.worker.spool import SpoolError, SpoolRecord
from kernelfleet.worker.state import StateError, WorkerState

logger = logging.getLogger(__name__)

TuneFn = Callable[..., dict[str, Any]]
ACKED, QUARANTINED, UNREACHABLE = "acked", "quarantined", "unreachable"
# "confirm": a re-run the regression detector asks for on the same chip; it is tuned and reported alike
TUNING_KINDS = ("tune", "confirm")
# a search of MLX's runtime settings for a model (worker/runtime_settings/job.py); its result is the
# chosen settings file, stored as this chip's runtime settings
RUNTIME_SETTINGS = "runtime_settings"
JobLine = Callable[[Lease, "JobOutcome"], None]


class _Abandon(BaseException):
    """Raised from the tuner's progress callback to stop a tune early.

    A BaseException on purpose: the tuner records ordinary exceptions from a candidate as that
    candidate's failure and carries on, and this must cross those handlers.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _PollAbandoned(BaseException):
    """Raised into an idle lease poll by :meth:`Agent.abandon_poll` (from the stop signal's handler):
    a BaseException, so that no handler on the way (httpx's, the client's) takes it for an error."""


@dataclass
class AgentConfig:
    coordinator: str
    state: WorkerState
    enroll_token: str | None = None
    name: str | None = None
    max_jobs: int | None = None
    strategy: str = "halving"
    budget: float | None = None
    seed: int = 0
    grace_seconds: float = 30.0
    poll_seconds: float = 5.0           # idle wait when the coordinator gives no Retry-After
    lease_wait_seconds: float = 10.0    # how long a lease request waits on the coordinator for work
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    startup_wait_seconds: float = 0.0   # how long to wait for a coordinator that is starting up


@dataclass
class JobOutcome:
    status: str                      # done | spooled | refused | failed | lost | released
    seconds: float = 0.0
    report: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class _JobRun:
    """Shared between the main thread (tuning) and the heartbeat thread."""

    lease: Lease
    lock: threading.Lock = field(default_factory=threading.Lock)
    lost: str | None = None          # why the lease is gone (409 detail)
    revoked: str | None = None       # 401 detail
    settled: bool = False            # the job was posted, failed or released: nothing more to do
    released: bool = False
    finished: threading.Event = field(default_factory=threading.Event)


def _load_tune() -> TuneFn:
    from kernelfleet.worker.tuner import tune

    return tune


def speedup(report: dict[str, Any]) -> float | None:
    """The built-in's median over the best config's median, from a tuning report."""
    trials = {t.get("config_key"): t for t in report.get("trials", [])}
    best, builtin = trials.get(report.get("best_config_key")), trials.get("builtin")
    if not best or not builtin or not best.get("median_us") or not builtin.get("median_us"):
        return None
    return float(builtin["median_us"]) / float(best["median_us"])


class Agent:
    def __init__(self, config: AgentConfig, *, tune: TuneFn | None = None,
                 machine_info: Callable[[str | None], dict[str, Any]] = machine_info,
                 on_job: JobLine | None = None) -> None:
        self.config = config
        self.state = config.state
        self.spool = config.state.spool
        self.client = CoordinatorClient(config.coordinator)
        self._tune = tune
        self._machine_info = machine_info
        self._on_job = on_job or (lambda lease, outcome: None)
        self.stop_event = threading.Event()
        self._stop_deadline: float | None = None
        self.backoff = Backoff(base=config.backoff_base, cap=max(config.backoff_base, config.backoff_max))
        self.jobs_run = 0
        self.worker_id: int | str | None = None
        self._current: _JobRun | None = None
        self._polling: int | None = None  # the thread waiting on a lease poll, if one is

    # ------------------------------------------------------------------ control

    def request_stop(self, immediate: bool = False) -> None:
        """Stop leasing; the current job may finish within the grace period (0 if ``immediate``)."""
        grace = 0.0 if immediate else self.config.grace_seconds
        deadline = time.monotonic() + grace
        if self._stop_deadline is None or deadline < self._stop_deadline:
            self._stop_deadline = deadline
        self.stop_event.set()

    def abandon_poll(self) -> None:
        """Called from a signal handler after :meth:`request_stop`: if the interrupted thread is
        waiting on a lease poll (long-polled: up to --lease-wait), give that up and stop now rather
        than when the poll answers. Raises into the poll; the loop then ends. A lease the coordinator
        grants meanwhile is given back (it sees the client gone), or, unconfirmed, returns to the queue
        by itself."""
        if self._polling is not None and self._polling == threading.get_ident():
            raise _PollAbandoned

    def _past_grace(self) -> bool:
        return self._stop_deadline is not None and time.monotonic() >= self._stop_deadline

    # ------------------------------------------------------------------ start-up

    def connect(self) -> None:
        connect(self.client, self.config.coordinator, self.config.startup_wait_seconds, self.stop_event)

    def authenticate(self) -> None:
        self.worker_id = authenticate(self.client, self.state, self.config.coordinator,
                                      self.config.enroll_token, lambda: self._machine_info(self.config.name))

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Run until stopped, --max-jobs is reached, or an :class:`AgentError`."""
        try:
            self.connect()
            self.authenticate()
            replayed = self.spool.replay()
            if replayed:
                logger.info("replaying %d spooled message(s) from %s", len(replayed), self.spool.pending_dir)
            while not self.stop_event.is_set():
                try:
                    if not self._step():
                        break
                except (AgentError, SpoolError, StateError):
                    raise
                except Exception:  # noqa: BLE001 - the loop's boundary: log it, back off, carry on
                    logger.exception("unexpected error in the worker loop")
                    self._wait_backoff("unexpected error")
            if len(self.spool):  # stopping: one last try, the rest waits on disk for the next start
                self.drain()
                if len(self.spool):
                    logger.warning("%d result(s) stay spooled in %s; they are sent at the next start",
                                   len(self.spool), self.spool.pending_dir)
        finally:
            self.client.close()

    def _step(self) -> bool:
        """One turn of the loop: deliver the spool, or lease and run one job. False: time to exit."""
        if len(self.spool):
            if not self.drain():
                self._wait_backoff("coordinator unreachable; holding spooled results, leasing nothing new")
            return True
        if self.config.max_jobs is not None and self.jobs_run >= self.config.max_jobs:
            logger.info("ran %d job(s) (--max-jobs); exiting", self.jobs_run)
            return False
        try:
            try:
                self._polling = threading.get_ident()
                lease = self.client.poll(self.config.lease_wait_seconds)
            finally:
                self._polling = None
        except _PollAbandoned:
            return False
        except Unauthorized as e:
            raise self._revoked(e.detail) from e
        except CoordinatorError as e:
            self._wait_backoff(f"cannot lease: {e}")
            return True
        self.backoff.reset()
        if isinstance(lease, Idle):
            idle = self.config.poll_seconds if lease.retry_after is None else lease.retry_after
            self.stop_event.wait(idle * (0.75 + 0.5 * _jitter()))
            return True
        if self.stop_event.is_set():  # the stop signal came while the lease was on its way
            self._release(_JobRun(lease))
            return False
        self.jobs_run += 1
        self.run_job(lease)
        return True

    def _wait_backoff(self, why: str) -> None:
        delay = self.backoff.next_delay()
        logger.warning("%s; retrying in %.1fs", why, delay)
        self.stop_event.wait(delay)

    def _revoked(self, detail: str | None) -> WorkerRevoked:
        return WorkerRevoked(f"the coordinator no longer accepts this worker ({detail}); it was probably "
                             "revoked. Stopping. Enroll again with --enroll-token to rejoin.")

    # ------------------------------------------------------------------ delivery

    def drain(self) -> bool:
        """Deliver every spooled record, oldest first. False when the coordinator is unreachable."""
        return all(self.deliver(record) != UNREACHABLE for record in self.spool.replay())

    def deliver(self, record: SpoolRecord) -> str:
        """Send one record: ACKED, QUARANTINED (terminal 409/422/4xx) or UNREACHABLE (kept spooled)."""
        try:
            answer = self.client.post(record.action, record.job_id, record.request_body())
        except Unreachable as e:
            logger.debug("delivery of %s failed: %s", record.name, e)
            return UNREACHABLE
        except Unauthorized as e:
            raise self._revoked(e.detail) from e
        except (LeaseConflict, Rejected, NotACoordinator) as e:
            where = self.spool.quarantine(record.path, f"{record.action} for job {record.job_id} refused "
                                                       f"({e.status}): {e.detail or e}")
            logger.warning("job %s: the coordinator refused the %s (%s: %s); moved it to %s", record.job_id,
                           record.action, e.status, e.detail, where)
            if record.action == "result" and isinstance(e, Rejected):
                self._fail_refused(record, e)
            self.backoff.reset()
            return QUARANTINED
        self.spool.ack(record)
        self.backoff.reset()
        logger.debug("job %s: %s acknowledged: %s", record.job_id, record.action, answer)
        return ACKED

    def _fail_refused(self, record: SpoolRecord, e: Rejected) -> None:
        """The lease is still ours but the report was refused (422, 413): say so at once rather than
        leave the job leased until its lease runs out (best effort; the quarantine keeps the report)."""
        error = f"the coordinator refused this worker's report ({e.status}): {e.detail}"
        try:
            self.client.post("fail", record.job_id,
                             {"lease_token": record.lease_token, "error": error[:8000]})
        except CoordinatorError as fail_error:
            logger.debug("job %s: could not report the refusal: %s", record.job_id, fail_error)

    # ------------------------------------------------------------------ one job

    def run_job(self, lease: Lease) -> JobOutcome:
        run = _JobRun(lease)
        self._current = run
        beat = threading.Thread(target=self._heartbeat_loop, args=(run,), name=f"heartbeat-{lease.job_id}",
                                daemon=True)
        beat.start()
        t0 = time.monotonic()
        try:
            outcome = self._tune_and_report(run)
        finally:
            run.finished.set()
            beat.join(timeout=5.0)
            self._current = None
        outcome.seconds = time.monotonic() - t0
        self._on_job(lease, outcome)
        if run.revoked is not None:
            raise self._revoked(run.revoked)
        return outcome

    def _tune_and_report(self, run: _JobRun) -> JobOutcome:
        lease = run.lease
        if lease.kind not in (*TUNING_KINDS, RUNTIME_SETTINGS):
            return self._report_failure(run, f"this worker cannot run jobs of kind {lease.kind!r}")

        def progress(*_args: Any, **_kwargs: Any) -> None:
            if run.lost is not None:
                raise _Abandon("lost")
            if run.revoked is not None:
                raise _Abandon("revoked")
            if self._past_grace():
                raise _Abandon("shutdown")

        try:
            if lease.kind == RUNTIME_SETTINGS:
                field_name, report = "runtime_settings", self._runtime_settings(lease, progress)
            else:
                tune = self._tune or _load_tune()
                field_name, report = "report", tune(lease.kernel, lease.shape, lease.dtype,
                                                    strategy=self.config.strategy, seed=self.config.seed,
                                                    budget=self.config.budget, progress=progress)
        except _Abandon as a:
            return self._abandon(run, a.reason)
        except Exception as e:  # noqa: BLE001 - any tuning failure is reported to the coordinator
            if run.lost is not None or run.revoked is not None:
                return self._abandon(run, "lost" if run.lost is not None else "revoked")
            logger.debug("job %s: tuning failed", lease.job_id, exc_info=True)
            return self._report_failure(run, f"{type(e).__name__}: {e}")
        with run.lock:
            if run.lost is not None or run.revoked is not None or run.settled:
                return self._abandon(run, "lost" if run.lost is not None else "revoked")
            run.settled = True
        try:
            record = self.spool.put("result", lease.job_id, lease.lease_token, {field_name: report})
        except ValueError as e:  # e.g. a non-finite float: the coordinator would refuse it too
            with run.lock:
                run.settled = False
            return self._report_failure(run, f"the tuning report cannot be sent: {e}")
        status = self._deliver_now(record)
        label = {ACKED: "done", QUARANTINED: "refused"}.get(status, "spooled")
        return JobOutcome(status=label, report=report)

    def _runtime_settings(self, lease: Lease, progress: Callable[[], None]) -> dict[str, Any]:
        """A runtime_settings job: the search of its campaign's model on this machine, within this
        worker's budget (``progress`` is called at each line of the search's log, so a lost lease or a
        stop abandons it between stages)."""
        from kernelfleet.worker.runtime_settings.job import run_leased

        if not lease.runtime_settings:
            raise ValueError(f"job {lease.job_id}: the lease carries no runtime_settings request")

        def log(line: str) -> None:
            logger.debug("job %s: %s", lease.job_id, line)
            progress()

        return run_leased(lease.runtime_settings, self.config.budget, log)

    def _deliver_now(self, record: SpoolRecord) -> str:
        status = self.deliver(record)
        if status == UNREACHABLE:
            logger.warning("job %s: coordinator unreachable; its %s stays in the spool until it answers",
                           record.job_id, record.action)
        return status

    def _report_failure(self, run: _JobRun, error: str) -> JobOutcome:
        with run.lock:
            if run.lost is not None or run.revoked is not None or run.settled:
                return self._abandon(run, "lost" if run.revoked is None else "revoked")
            run.settled = True
        lease = run.lease
        logger.warning("job %s (%s %s %s) failed: %s", lease.job_id, lease.kernel, lease.shape, lease.dtype,
                       error)
        record = self.spool.put("fail", lease.job_id, lease.lease_token, {"error": error[:8000]})
        self._deliver_now(record)
        return JobOutcome(status="failed", error=error)

    def _abandon(self, run: _JobRun, reason: str) -> JobOutcome:
        lease = run.lease
        if reason == "shutdown" or run.released:
            self._release(run)
            return JobOutcome(status="released")
        if reason == "revoked":
            return JobOutcome(status="lost", error=f"worker revoked: {run.revoked}")
        logger.warning("job %s: lease lost (%s); abandoned, its result is not posted", lease.job_id, run.lost)
        return JobOutcome(status="lost", error=run.lost)

    def _release(self, run: _JobRun) -> None:
        with run.lock:
            if run.settled:
                return
            run.settled = run.released = True
        try:
            self.client.release(run.lease.job_id, run.lease.lease_token)
            logger.info("job %s: not finished within the grace period; released it to the coordinator",
                           run.lease.job_id)
        except CoordinatorError as e:
            logger.warning("job %s: could not release it (%s); its lease will expire on its own",
                           run.lease.job_id, e)

    # ------------------------------------------------------------------ heartbeats

    def _heartbeat_loop(self, run: _JobRun) -> None:
        lease = run.lease
        interval = max(0.2, lease.lease_seconds / 3.0)
        # the first heartbeat confirms the lease: at once, retried every second until it gets through
        # (an unconfirmed lease goes back to the queue after the coordinator's confirm deadline)
        next_beat = time.monotonic()
        confirmed = warned = False
        while not run.finished.wait(min(0.25, interval)):
            if self._past_grace():
                self._enforce_grace(run)
                return
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + interval
            try:
                reply = self.client.heartbeat(lease.job_id, lease.lease_token)
                next_beat = time.monotonic() + next_interval(reply, interval)
                confirmed = True
                if warned:
                    logger.info("job %s: heartbeats reach the coordinator again", lease.job_id)
                warned = False
            except LeaseConflict as e:
                run.lost = e.detail or str(e)
                return
            except Unauthorized as e:
                run.revoked = e.detail or str(e)
                return
            except CoordinatorError as e:
                if not warned:
                    logger.warning("job %s: heartbeat failed (%s); still tuning", lease.job_id, e)
                warned = True
                if not confirmed:
                    next_beat = time.monotonic() + 1.0

    def _enforce_grace(self, run: _JobRun) -> None:
        """At the end of the grace period: release the job, and exit if the tune does not give way."""
        self._release(run)
        if run.finished.wait(5.0):
            return
        logger.warning("job %s: the tuner did not stop; exiting now (the job was given back)",
                       run.lease.job_id)
        for handler in logging.getLogger().handlers + logging.getLogger("kernelfleet").handlers:
            handler.flush()
        os._exit(0)


def next_interval(reply: object, default: float) -> float:
    """When to send the next heartbeat: what the coordinator's answer says (``next_heartbeat_seconds``:
    it spreads the fleet's heartbeats), kept between 0.2 s and ``default`` (a third of the lease);
    ``default`` from a coordinator that does not say."""
    said = reply.get("next_heartbeat_seconds") if isinstance(reply, dict) else None
    if isinstance(said, int | float) and not isinstance(said, bool) and said == said:
        return min(max(0.2, float(said)), default)
    return default


def _jitter() -> float:
    import random

    return random.random()
