"""One pydantic-settings class for the whole coordinator (env prefix ``KERNELFLEET_``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from platformdirs import user_data_dir
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path(user_data_dir("kernelfleet", appauthor=False))


def default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'kernelfleet.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNELFLEET_", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    admin_token: str | None = None
    host: str = "127.0.0.1"
    port: int = 8600
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
    # regression detection
    regression_min_effect: float = 0.03
    regression_history_runs: int = 20


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
