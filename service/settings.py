"""One pydantic-settings class for the whole coordinator (env prefix ``KERNELFLEET_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernelfleet import local_state
from kernelfleet.local_state import default_data_dir, default_database_url

__all__ = ["Settings", "default_data_dir", "default_database_url"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNELFLEET_", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    admin_token: str | None = None
    # where local state lives (generated admin token, the local worker's state); defaults to the
    # SQLite database's folder, or the user's data directory for PostgreSQL
    data_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8600
    # the coordinator's address as users and workers reach it (the pull command on /profiles);
    # default http://{host}:{port}. Never taken from a request's Host or X-Forwarded-* headers.
    public_url: str | None = None
    # leasing
    lease_seconds: float = 120.0
    max_attempts: int = 3
    requeue_backoff_seconds: float = 5.0
    requeue_backoff_max_seconds: float = 300.0
    reaper_interval_seconds: float = 5.0
    # a heartbeat's answer tells the worker when to send the next one: a third of the lease, less a
    # random share of up to this fraction of it (spreads heartbeats; workers that ignore it beat
    # every third of the lease, as before)
    heartbeat_jitter: float = Field(default=0.4, ge=0.0, lt=1.0)
    # a fresh lease runs out after this unless the worker confirms it (its first heartbeat)
    lease_confirm_seconds: float = 30.0
    # idle workers: a lease request may wait this long for work (long-poll); one query per
    # lease_poll_seconds per process looks for work for all waiting requests; a 204 says
    # `Retry-After: idle_retry_seconds`
    lease_wait_max_seconds: float = 20.0
    lease_poll_seconds: float = 1.0
    idle_retry_seconds: int = 10
    enrollment_token_ttl_seconds: float = 3600.0
    worker_offline_after_seconds: float = 300.0
    # database connections per process, and the threads that run sync routes (default: one per
    # connection, so a thread never waits for a connection)
    db_pool_size: int = 20
    db_max_overflow: int = 5
    db_pool_timeout_seconds: float = 30.0
    threadpool_size: int | None = None
    # of those threads, at most this many store results at once (a real 19 KB report costs ~10 ms of CPU):
    # the rest keep serving heartbeats and leases while results queue. A result is 8 database round
    # trips (tests/service/test_completion_round_trips.py), so 4 at once keep up with ~60 results/s
    # per process with the database 7 ms a trip away, ~20/s at 20 ms: raise it for a farther database
    # (the threads it takes come out of the others' share: see threads())
    result_concurrency: int = 4
    # request limits
    max_body_bytes: int = 4 * 1024 * 1024
    # unauthenticated GETs (public dashboard, its JSON, /metrics) running at once per process; more
    # wait up to public_read_wait_seconds for a slot, then get 503 + Retry-After (service/read_limit.py)
    public_read_concurrency: int = Field(default=4, ge=1)
    public_read_wait_seconds: float = Field(default=2.0, ge=0)
    # /healthz answers 503 (database "unresponsive") when its probe takes longer than this
    healthz_timeout_seconds: float = Field(default=2.0, gt=0)
    # dashboard
    dashboard_public: bool = True
    # background work (service/background.py): result reactions, then profile building
    background_interval_seconds: float = 0.5
    # run that loop in each server process (an app built by create_app, e.g. in tests); `kernelfleet
    # serve` turns it off there and runs the loop in one background process of its own
    background_in_server: bool = True
    # that background process's niceness (added to serve's): when the host's cores are all busy, the
    # server processes (requests) get the CPU first; queued work coalesces and catches up after
    background_nice: int = Field(default=10, ge=0, le=19)
    profile_build_delay_seconds: float = 0.0  # testing: make every build this much slower
    # a chip's profile is rebuilt at most this often: a busy chip's results coalesce into one build
    # per interval instead of back-to-back builds (each is O(the backend's stats rows))
    profile_min_interval_seconds: float = 5.0
    prediction_min_confidence: float = 0.8  # below it a predicted entry is the built-in
    calibration_interval_seconds: float = 60.0
    # regression detection
    regression_min_effect: float = 0.03
    regression_history_runs: int = 20
    # a suspected regression whose confirm job no worker has leased this long, while no worker of its
    # chip is online, is settled by the runs stored since, else raised as unconfirmed
    regression_confirm_wait_seconds: float = 900.0
    # alerts (service/notifications.py): a POST to each URL when a regression is confirmed, in the
    # background, retried with exponential backoff; KERNELFLEET_WEBHOOK_URLS='["https://..."]'
    webhook_urls: list[str] = Field(default_factory=list)
    webhook_format: Literal["json", "slack"] = "json"  # slack: {"text": ...} for Slack-compatible hooks
    webhook_timeout_seconds: float = 5.0
    webhook_max_attempts: int = 6
    webhook_backoff_seconds: float = 10.0  # first retry after this, doubling up to the max
    webhook_backoff_max_seconds: float = 900.0

    def engine_options(self) -> dict[str, Any]:
        return {"pool_size": self.db_pool_size, "max_overflow": self.db_max_overflow,
                "pool_timeout": self.db_pool_timeout_seconds}

    def threads(self) -> int:
        """Threads for sync routes other than result storage (see :attr:`result_concurrency`)."""
        total = self.threadpool_size or self.db_pool_size + self.db_max_overflow
        return max(1, total - self.result_concurrency)

    @property
    def is_local(self) -> bool:
        """Local mode: the database is a SQLite file on this machine."""
        return local_state.is_local(self.database_url)

    @property
    def local_url(self) -> str:
        """This coordinator's address from this machine (a wildcard bind becomes 127.0.0.1)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def resolved_public_url(self) -> str:
        return (self.public_url or self.local_url).rstrip("/")

    def resolved_data_dir(self) -> Path:
        return local_state.data_dir(self.database_url, self.data_dir)
