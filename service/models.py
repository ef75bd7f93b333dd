"""ORM rows. The schema changes only through Alembic migrations (migrations/versions).

Times are timezone-aware UTC and are set from the database clock (``func.now()``),
never from the coordinator's own clock.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(cls, native_enum=False, length=24, values_callable=lambda e: [m.value for m in e],
                validate_strings=True)


class Backend(enum.StrEnum):
    metal = "metal"
    cuda = "cuda"
    cpu = "cpu"


class JobState(enum.StrEnum):
    queued = "queued"
    leased = "leased"
    done = "done"
    dead = "dead"
    cancelled = "cancelled"  # its campaign was cancelled or deleted, or its regression settled


class JobKind(enum.StrEnum):
    tune = "tune"
    confirm = "confirm"  # a confirmation re-run asked for by the regression detector
    # a search of MLX's runtime settings for a model (its campaign's spec["runtime_settings"]); kernel
    # "runtime_settings", shape the model's shape key, dtype its entries' dtype (e.g. bf16, 4bit)
    runtime_settings = "runtime_settings"


class TrialStatus(enum.StrEnum):
    ok = "ok"
    compile_error = "compile_error"
    launch_error = "launch_error"
    mismatch = "mismatch"
    unsupported = "unsupported"  # the chip cannot run this config (threadgroup over the pipeline's limit)


class RegressionStatus(enum.StrEnum):
    confirming = "confirming"  # suspected; a confirmation job is queued
    open = "open"  # confirmed, not yet acknowledged
    acknowledged = "acknowledged"
    dismissed = "dismissed"  # the confirmation run did not reproduce it
    # triaged by a person (POST /regressions/{id}/triage, service/regressions/triage.py)
    invalid = "invalid"  # noise: no real change (the baseline does not restart at it)
    ignored = "ignored"  # a real change, expected: the slower level is the new normal
    fixed = "fixed"  # a real change, undone later (fixed_by_regression_id or fixed_by_result_id)


class TokenScope(enum.StrEnum):
    """What an API token may do (``kernelfleet admin tokens create --scope``)."""

    admin = "admin"  # everything the admin token may do
    read = "read"  # the dashboard and its JSON, /metrics, `kernelfleet pull`
    enroll = "enroll"  # mint enrollment tokens (the Add a worker page and command)


TZ = DateTime(timezone=True)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    chip: Mapped[str] = mapped_column(String(128), index=True)
    backend: Mapped[Backend] = mapped_column(_enum(Backend))
    gpu_cores: Mapped[int | None] = mapped_column(Integer)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    os: Mapped[str] = mapped_column(String(128), default="")
    mlx_version: Mapped[str] = mapped_column(String(64), default="")
    driver: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(TZ)
    revoked_at: Mapped[datetime | None] = mapped_column(TZ)


class EnrollmentToken(Base):
    __tablename__ = "enrollment_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(TZ)
    used_at: Mapped[datetime | None] = mapped_column(TZ)  # when its last use was taken
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"))  # the last
    # how many workers it may enroll (one agent per GPU of a host: `kernelfleet worker --gpus all`)
    max_uses: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    uses: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))


class ApiToken(Base):
    """A named, scoped, revocable bearer token, stored only as its SHA-256 digest (``kernelfleet admin
    tokens ...``). The ``KERNELFLEET_ADMIN_TOKEN`` of the settings is the bootstrap admin token beside
    these."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    scope: Mapped[TokenScope] = mapped_column(_enum(TokenScope))
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(TZ)


class Campaign(Base):
    __tablename__ = "campaigns"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    target_backend: Mapped[Backend | None] = mapped_column(_enum(Backend))
    target_chip: Mapped[str | None] = mapped_column(String(128))  # SQL LIKE-free glob, matched by the lease
    max_attempts: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"kernels": [...], "shapes": [...], "dtypes": [...]}
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    # cancelled: its queued jobs are cancelled, leased ones finish; deleted: cancelled and hidden, the row
    # goes once no job of it is leased (service/campaign_control.py)
    cancelled_at: Mapped[datetime | None] = mapped_column(TZ)
    deleted_at: Mapped[datetime | None] = mapped_column(TZ)

    jobs: Mapped[list[Job]] = relationship(back_populates="campaign", lazy="raise")


class JobTarget(Base):
    """One distinct (backend, chip glob) that jobs were created for. A handful of rows: the lease
    matches a worker against these in Python, then picks from the jobs of the matching targets through
    ``ix_jobs_queued_target`` (never a scan over all queued jobs)."""

    __tablename__ = "job_targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(320), unique=True)  # JSON [backend, chip], see service/targets.py
    target_backend: Mapped[Backend | None] = mapped_column(_enum(Backend))
    target_chip: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


QUEUED = text("state = 'queued'")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_lease_pick", "state", "available_at", "id"),
        Index("ix_jobs_campaign_state", "campaign_id", "state"),
        Index("ix_jobs_leased_expiry", "state", "lease_expires_at"),
        # the lease's pick: per target, the oldest available queued job (partial: queued jobs only)
        Index("ix_jobs_queued_target", "target_id", "available_at", "id",
              postgresql_where=QUEUED, sqlite_where=QUEUED),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int | None] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"))
    kind: Mapped[JobKind] = mapped_column(_enum(JobKind), default=JobKind.tune)
    kernel: Mapped[str] = mapped_column(String(64))
    shape: Mapped[str] = mapped_column(String(128))  # e.g. "4096x4096"
    dtype: Mapped[str] = mapped_column(String(16))
    target_backend: Mapped[Backend | None] = mapped_column(_enum(Backend))
    target_chip: Mapped[str | None] = mapped_column(String(128))  # exact chip or glob pattern
    target_id: Mapped[int] = mapped_column(ForeignKey("job_targets.id"))
    state: Mapped[JobState] = mapped_column(_enum(JobState), default=JobState.queued)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    lease_token: Mapped[str | None] = mapped_column(String(64))  # SHA-256 hex digest, never the token
    # False until the worker's first heartbeat confirms it got the lease; an unconfirmed lease runs out
    # after settings.lease_confirm_seconds and is requeued without spending its attempt
    lease_confirmed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    leased_by: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"), index=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(TZ)
    available_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(TZ)
    last_error: Mapped[str | None] = mapped_column(Text)

    campaign: Mapped[Campaign | None] = relationship(back_populates="jobs", lazy="raise")


class Result(Base):
    """One accepted tuning run: the job's result, stored in the transaction that completes it."""

    __tablename__ = "results"
    __table_args__ = (
        Index("ix_results_series", "chip", "kernel", "shape", "dtype", "created_at"),
        Index("ix_results_kernel_created", "kernel", "created_at"),
        Index("ix_results_worker_created", "worker_id", "created_at"),
        # the same report imported twice is stored once
        Index("ux_results_import_digest", "payload_digest", unique=True,
              sqlite_where=text("source = 'import'"), postgresql_where=text("source = 'import'")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), unique=True)
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"))
    lease_token: Mapped[str | None] = mapped_column(String(64))  # SHA-256 hex digest of the lease token
    payload_digest: Mapped[str] = mapped_column(String(64))
    response: Mapped[dict[str, Any]] = mapped_column(JSON)  # what the completion call answered
    source: Mapped[str] = mapped_column(String(16), default="lease")  # lease | import
    kernel: Mapped[str] = mapped_column(String(64))
    shape: Mapped[str] = mapped_column(String(128))
    dtype: Mapped[str] = mapped_column(String(16))
    chip: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(16))
    mlx_version: Mapped[str] = mapped_column(String(64))
    # the kernels' source revision (a git commit, or the package version) when the report said
    revision: Mapped[str | None] = mapped_column(String(64), index=True)
    os: Mapped[str] = mapped_column(String(128))
    driver: Mapped[str | None] = mapped_column(String(128))
    kernel_hash: Mapped[str] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(32), default="")
    best_config_key: Mapped[str | None] = mapped_column(String(256))  # None when every trial failed
    best_is_builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    best_median_us: Mapped[float | None] = mapped_column(Float)
    best_p10_us: Mapped[float | None] = mapped_column(Float)
    best_p90_us: Mapped[float | None] = mapped_column(Float)
    builtin_median_us: Mapped[float | None] = mapped_column(Float)
    golden: Mapped[dict[str, Any]] = mapped_column(JSON)  # digest, stats, bounded strided sample
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())  # when it was stored
    # when the worker measured it (its clock, from the report); None for old reports that did not say
    measured_at: Mapped[datetime | None] = mapped_column(TZ)

    trials: Mapped[list[Trial]] = relationship(back_populates="result", lazy="raise",
                                               cascade="all, delete-orphan")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (Index("ix_trials_result", "result_id", "config_key"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    config_key: Mapped[str] = mapped_column(String(256))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    is_builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[TrialStatus] = mapped_column(_enum(TrialStatus))
    error: Mapped[str | None] = mapped_column(Text)
    median_us: Mapped[float | None] = mapped_column(Float)
    p10_us: Mapped[float | None] = mapped_column(Float)
    p90_us: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer, default=0)
    samples_us: Mapped[list[Any] | None] = mapped_column(JSON)  # raw samples; None when capped
    max_abs_err: Mapped[float | None] = mapped_column(Float)
    max_rel_err: Mapped[float | None] = mapped_column(Float)
    # the config whose measurement stands for this one: identical kernels on the backend, measured once
    shares_measurement_with: Mapped[str | None] = mapped_column(String(256))

    result: Mapped[Result] = relationship(back_populates="trials", lazy="raise")


class Regression(Base):
    __tablename__ = "regressions"
    __table_args__ = (
        Index("ix_regressions_series", "chip", "kernel", "shape", "dtype"),
        Index("ix_regressions_status_detected", "status", "detected_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    group_key: Mapped[str] = mapped_column(String(256), index=True)  # one alert per cause across chips
    kernel: Mapped[str] = mapped_column(String(64))
    shape: Mapped[str] = mapped_column(String(128))
    dtype: Mapped[str] = mapped_column(String(16))
    chip: Mapped[str] = mapped_column(String(128))
    config_key: Mapped[str | None] = mapped_column(String(256))
    status: Mapped[RegressionStatus] = mapped_column(_enum(RegressionStatus))
    detector: Mapped[str] = mapped_column(String(32))  # step | changepoint
    baseline_median_us: Mapped[float] = mapped_column(Float)
    new_median_us: Mapped[float] = mapped_column(Float)
    effect: Mapped[float] = mapped_column(Float)  # new / baseline - 1
    p_value: Mapped[float | None] = mapped_column(Float)
    cause: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"mlx_version": ["0.32.3", "0.32.4"], ...}
    baseline_result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="SET NULL"))
    result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="SET NULL"))
    confirm_job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    detected_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    acknowledged_at: Mapped[datetime | None] = mapped_column(TZ)
    acknowledged_note: Mapped[str | None] = mapped_column(Text)
    # when its confirmation was announced (webhook deliveries queued); None: not yet, or never confirmed
    alerted_at: Mapped[datetime | None] = mapped_column(TZ)
    # how it was confirmed ("re-run", "stored runs", "unconfirmed: no worker of this chip") or, while
    # confirming without a job, what it waits for (service/regressions/engine.py)
    confirmation: Mapped[str | None] = mapped_column(String(128))
    # the last change a person made to its status (triage or acknowledge): who ("admin", or "token ID
    # (NAME)" for an API token), when and why; every change is a RegressionEvent row
    status_changed_by: Mapped[str | None] = mapped_column(String(160))
    status_changed_at: Mapped[datetime | None] = mapped_column(TZ)
    status_note: Mapped[str | None] = mapped_column(Text)
    # what fixed it (status fixed): a later alert or improvement of the series, or the run that shows it
    fixed_by_regression_id: Mapped[int | None] = mapped_column(
        ForeignKey("regressions.id", ondelete="SET NULL"))
    fixed_by_result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="SET NULL"))
    # set when a person moved it into another group or out of its group: what was done, by whom and
    # why. While set, the scan's re-placement keeps its group_key (service/regressions/engine.py)
    group_note: Mapped[str | None] = mapped_column(Text)


class RegressionEvent(Base):
    """One change a person made to a regression (append-only): its status (``action`` "status":
    ``old``/``new`` statuses) or its group (``action`` "group": ``old``/``new`` group keys)."""

    __tablename__ = "regression_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    regression_id: Mapped[int] = mapped_column(ForeignKey("regressions.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    actor: Mapped[str] = mapped_column(String(160))
    action: Mapped[str] = mapped_column(String(16))  # status | group
    old: Mapped[str | None] = mapped_column(String(256))
    new: Mapped[str] = mapped_column(String(256))
    note: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # e.g. {"fixed_by_result_id": 42}


class SeriesThreshold(Base):
    """A series' own minimum effect: the regression detectors use it instead of the settings'
    ``regression_min_effect`` for that (chip, kernel, shape, dtype), online and in the scan."""

    __tablename__ = "series_thresholds"
    __table_args__ = (
        UniqueConstraint("chip", "kernel", "shape", "dtype", name="uq_series_thresholds_series"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(128))
    kernel: Mapped[str] = mapped_column(String(64))
    shape: Mapped[str] = mapped_column(String(128))
    dtype: Mapped[str] = mapped_column(String(16))
    min_effect: Mapped[float] = mapped_column(Float)
    note: Mapped[str | None] = mapped_column(Text)
    set_by: Mapped[str] = mapped_column(String(160))
    set_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class Profile(Base):
    __tablename__ = "profiles"
    __table_args__ = (
        UniqueConstraint("chip", "mlx_version", "version", name="uq_profiles_chip_mlx_version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(128), index=True)
    mlx_version: Mapped[str | None] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    etag: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class RuntimeSetting(Base):
    """MLX's runtime settings one worker chose for its chip, per (MLX version, model shape, dtype,
    workload): ``kernelfleet settings tune``'s entry, pushed by ``kernelfleet settings push``. The
    newest push of a key replaces the row (``measured_at`` says when it was measured)."""

    __tablename__ = "runtime_settings"
    __table_args__ = (
        UniqueConstraint("chip", "mlx_version", "model", "dtype", "workload", name="uq_runtime_settings_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(128), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str | None] = mapped_column(String(64))
    mlx_version: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    dtype: Mapped[str] = mapped_column(String(16))
    workload: Mapped[str] = mapped_column(String(32))
    entry: Mapped[dict[str, Any]] = mapped_column(JSON)  # the settings file's entry, as pushed
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id", ondelete="SET NULL"))
    measured_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class ConfigStat(Base):
    """Incremental statistics of one config on one chip, backend, MLX version and kernel source, at one
    (kernel, shape, dtype): updated in the transaction that stores each result, at O(its trials).
    Profiles are built from these rows, never from raw trials (:mod:`kernelfleet.service.aggregates`)."""

    __tablename__ = "config_stats"
    __table_args__ = (
        UniqueConstraint("chip", "backend", "mlx_version", "kernel", "shape", "dtype", "kernel_hash",
                         "config_key", name="uq_config_stats_key"),
        Index("ix_config_stats_backend_kernel", "backend", "kernel"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(128), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    mlx_version: Mapped[str] = mapped_column(String(64))
    kernel: Mapped[str] = mapped_column(String(64))
    shape: Mapped[str] = mapped_column(String(128))
    dtype: Mapped[str] = mapped_column(String(16))
    kernel_hash: Mapped[str] = mapped_column(String(64))
    config_key: Mapped[str] = mapped_column(String(256))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    is_builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    runs: Mapped[int] = mapped_column(Integer, default=0)
    imported_runs: Mapped[int] = mapped_column(Integer, default=0)
    worker_ids: Mapped[list[Any]] = mapped_column(JSON)  # distinct enrolled workers (bounded)
    first_seen_at: Mapped[datetime | None] = mapped_column(TZ)
    last_seen_at: Mapped[datetime | None] = mapped_column(TZ)
    last_result_id: Mapped[int] = mapped_column(Integer)
    medians_us: Mapped[list[Any]] = mapped_column(JSON)  # the newest run medians (bounded window)
    speedups: Mapped[list[Any]] = mapped_column(JSON)  # built-in / this config, same runs (bounded)
    center_us: Mapped[float] = mapped_column(Float)  # median of the window
    spread: Mapped[float] = mapped_column(Float)  # 1.4826 * MAD / median of the window (relative)
    speedup: Mapped[float | None] = mapped_column(Float)  # median of the same-run speedups
    speedup_lo: Mapped[float | None] = mapped_column(Float)  # ~95 % interval of that median
    speedup_hi: Mapped[float | None] = mapped_column(Float)


class ProfileRequest(Base):
    """A chip whose profile should be rebuilt: inserted with each stored result (insert-only, so
    results of one chip never contend on a row), drained by the background builder."""

    __tablename__ = "profile_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(128), index=True)
    allow_predicted: Mapped[bool] = mapped_column(Boolean, default=False)  # build even without data
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class ResultEvent(Base):
    """A stored result whose reactions (the result hooks: regression detection, ...) have not run yet.
    Inserted in the result's own transaction, drained in id order by the background loop."""

    __tablename__ = "result_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class ProfileBuild(Base):
    """One background build of a chip's profiles: who built it and when (replicas never overlap)."""

    __tablename__ = "profile_builds"
    __table_args__ = (Index("ix_profile_builds_chip_started", "chip", "started_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chip: Mapped[str] = mapped_column(String(128))
    builder: Mapped[str] = mapped_column(String(128))  # host:pid
    started_at: Mapped[datetime] = mapped_column(TZ)
    finished_at: Mapped[datetime] = mapped_column(TZ)
    requests: Mapped[int] = mapped_column(Integer)  # coalesced requests it answered
    oldest_request_at: Mapped[datetime | None] = mapped_column(TZ)
    versions: Mapped[dict[str, Any]] = mapped_column(JSON)  # {mlx_version or "": version}


class RegressionScan(Base):
    """One change-point scan asked for through ``POST /regressions/scan``: queued by the request, run
    by the background loop (:mod:`kernelfleet.service.regression_scans`). At most one is queued at a
    time (the partial unique index): a request while one is queued joins it."""

    __tablename__ = "regression_scans"
    __table_args__ = (
        Index("uq_regression_scans_queued", "status", unique=True,
              postgresql_where=text("status = 'queued'"), sqlite_where=text("status = 'queued'")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))  # queued, running, done, failed
    requested_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    requests: Mapped[int] = mapped_column(Integer, default=1)  # the requests it answers (coalesced)
    started_at: Mapped[datetime | None] = mapped_column(TZ)
    finished_at: Mapped[datetime | None] = mapped_column(TZ)
    runner: Mapped[str | None] = mapped_column(String(128))  # host:pid of the process that ran it
    series: Mapped[int | None] = mapped_column(Integer)
    findings: Mapped[int | None] = mapped_column(Integer)
    created: Mapped[list[Any] | None] = mapped_column(JSON)  # regression ids it created
    moved: Mapped[list[Any] | None] = mapped_column(JSON)  # open regressions it re-placed
    error: Mapped[str | None] = mapped_column(Text)


class Calibration(Base):
    """Prediction confidence calibrated on held-out data, per backend: bins of raw scores and the
    observed rate at which predictions in each bin landed within 5 % of the tuned best."""

    __tablename__ = "prediction_calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    backend: Mapped[str] = mapped_column(String(16), index=True)
    bins: Mapped[list[Any]] = mapped_column(JSON)  # [{"lo","hi","n","within","rate"}]
    samples: Mapped[int] = mapped_column(Integer)
    source_stats: Mapped[int] = mapped_column(Integer)  # the newest result id its stats had folded in
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class DeliveryState(enum.StrEnum):
    pending = "pending"  # waiting for its next attempt
    delivered = "delivered"
    failed = "failed"  # every attempt failed


class WebhookDelivery(Base):
    """One regression alert to one webhook URL, delivered in the background with retries
    (:mod:`kernelfleet.service.notifications`)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    regression_id: Mapped[int | None] = mapped_column(ForeignKey("regressions.id", ondelete="SET NULL"),
                                                      index=True)
    url: Mapped[str] = mapped_column(String(2048))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[DeliveryState] = mapped_column(_enum(DeliveryState), default=DeliveryState.pending)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    delivered_at: Mapped[datetime | None] = mapped_column(TZ)


class WebhookAttempt(Base):
    """One POST of a delivery: what the receiver answered, or why it could not be reached."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
                                             index=True)
    attempted_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float] = mapped_column(Float)
