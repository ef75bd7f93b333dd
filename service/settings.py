"""One pydantic-settings class for the whole coordinator (env prefix ``KERNELFLEET_``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from platformdirs import user_data_dir
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url


def default_data_dir() -> Path:
    return Path(user_data_dir("kernelfleet", appauthor=False))


def default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'kernelfleet.db'}"


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
    enrollment_token_ttl_seconds: float = 3600.0
    worker_offline_after_seconds: float = 300.0
    # request limits
    max_body_bytes: int = 4 * 1024 * 1024
    # dashboard
    dashboard_public: bool = True
    # background work (service/background.py): result reactions, then profile building
    background_interval_seconds: float = 0.5
    profile_build_delay_seconds: float = 0.0  # testing: make every build this much slower
    prediction_min_confidence: float = 0.8  # below it a predicted entry is the built-in
    calibration_interval_seconds: float = 60.0
    # regression detection
    regression_min_effect: float = 0.03
    regression_history_runs: int = 20

    @property
    def is_local(self) -> bool:
        """Local mode: the database is a SQLite file on this machine."""
        return self.database_url.startswith("sqlite")

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
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        if self.is_local:
            database = make_url(self.database_url).database
            if database and database != ":memory:":
                return Path(database).expanduser().resolve().parent
        return default_data_dir()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
