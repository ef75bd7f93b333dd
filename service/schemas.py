"""API schemas (pydantic), separate from the ORM rows in :mod:`kernelfleet.service.models`.

Every request model forbids unknown fields, non-finite floats and NUL characters, bounds its strings
and lists, and is strict: ``true`` is not a number, ``"5"`` is not an int, ``1`` is not a bool.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kernelfleet.service.canonical import canonical_json
from kernelfleet.service.db import stored_utc

MAX_TRIALS = 512
MAX_SAMPLES = 1000
MAX_GOLDEN_SAMPLE = 256
MAX_CAMPAIGN_JOBS = 10_000
MAX_TOKEN_USES = 64  # workers one enrollment token may enroll (GPUs of one host)
# 4 PiB: below 2**53, so that the bound means the same to every JSON reader (past 2**53 a client
# reading numbers as doubles took 2**62 + 95 for 2**62, and had it refused)
MAX_MEMORY_BYTES = 2**52
DTYPES = ("float32", "float16", "bfloat16")


class Strict(BaseModel):
    """Base of every request model. ``strict=True``: in strict mode pydantic refuses ISO strings for
    ``datetime`` fields of request bodies (FastAPI validates parsed JSON), so give such a field
    ``Field(strict=False)``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if _has_nul(value):  # PostgreSQL cannot store NUL in text: refuse it for both databases
            raise PydanticCustomError("string_nul", "must not contain NUL characters (\\u0000)")
        return value


_NO_TEXT = frozenset((int, float, bool, type(None)))  # what holds no string (subclasses are looked into)


def _has_nul(value: Any) -> bool:
    """A NUL in a validated field: a string, or one inside a list or a dict (keys and values, at any
    depth, as a free-form model config holds them: lists may mix strings with numbers and booleans).
    Nested models check their own fields. A list of numbers only (a trial's samples, the golden sample)
    is told by its items' types in one pass in C: item by item in Python it was 0.18 ms of a 40 KB
    report's 0.30 ms validation."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        if _NO_TEXT.issuperset(map(type, value)):
            return False
        return any(_has_nul(v) for v in value if isinstance(v, (str, list, dict)))
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False


def _check_shape(text: str) -> str:
    parts = text.split("x")
    if not all(p.isdigit() and p.isascii() and int(p) > 0 for p in parts):
        raise ValueError(f"malformed shape {text!r}: expected positive integers joined by 'x', "
                         f"like 4096x4096")
    return text


def _utc(value: datetime | None) -> str | None:
    if value is None:
        return None
    return stored_utc(value).isoformat()


Name = Annotated[str, Field(min_length=1, max_length=128)]
ShortText = Annotated[str, Field(max_length=128)]
KernelName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$",
                                  description="a catalog kernel name such as rmsnorm")]
ShapeText = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_check_shape)]
DType = Literal["float32", "float16", "bfloat16"]
Workload = Annotated[str, Field(max_length=32, pattern=r"^(prefill|decode):[1-9][0-9]{0,6}$",
                                description="prefill:TOKENS or decode:BATCH")]
BackendName = Literal["metal", "cuda", "cpu"]
TrialStatusName = Literal["ok", "compile_error", "launch_error", "mismatch", "unsupported"]
JobStateName = Literal["queued", "leased", "done", "dead", "cancelled"]
Token = Annotated[str, Field(min_length=1, max_length=256)]
Micros = Annotated[float, Field(ge=0.0)]
UtcTime = Annotated[datetime, PlainSerializer(_utc, return_type=str)]
OptUtcTime = Annotated[datetime | None, PlainSerializer(_utc, return_type=str | None)]


# ---- the tuning report (docs: /work/shared contract) ----

class ReportEnv(Strict):
    chip: Name
    backend: BackendName
    mlx_version: Annotated[str, Field(min_length=1, max_length=64)]
    os: ShortText
    driver: ShortText | None = None
    kernel_hash: Annotated[str, Field(min_length=1, max_length=64)]
    gpu_cores: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    memory_bytes: Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)] | None = None


class ReportTrial(Strict):
    config_key: Annotated[str, Field(min_length=1, max_length=256)]
    config: Annotated[dict[Annotated[str, Field(max_length=64)], int | float | str | bool],
                      Field(max_length=64)]
    is_builtin: bool = False
    status: TrialStatusName
    error: Annotated[str, Field(max_length=8000)] | None = None
    samples_us: Annotated[list[Micros], Field(max_length=MAX_SAMPLES)] | None = None
    median_us: Micros | None = None
    p10_us: Micros | None = None
    p90_us: Micros | None = None
    n: Annotated[int, Field(ge=0, le=10**9)] = 0
    max_abs_err: Annotated[float, Field(ge=0.0)] | None = None
    max_rel_err: Annotated[float, Field(ge=0.0)] | None = None
    # the config measured for this one: their kernels are identical on the backend (worker/measure.py)
    shares_measurement_with: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ReportTrial:
        if self.status == "ok" and self.median_us is None:
            raise ValueError(f"trial {self.config_key!r} has status ok but no median_us")
        if self.status != "ok" and (self.median_us is not None or self.n != 0):
            raise ValueError(f"failed trial {self.config_key!r} ({self.status}) "
                             f"must have median_us null and n 0")
        return self


class GoldenStats(Strict):
    mean: float
    std: float
    min: float
    max: float
    abs_mean: float


class Golden(Strict):
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the output")]
    stats: GoldenStats
    # reports made before the strided sample existed have none (benchmarks/results/*_run6_tuning.jsonl)
    sample: Annotated[list[float], Field(max_length=MAX_GOLDEN_SAMPLE)] = Field(default_factory=list)
    stride: Annotated[int, Field(ge=1)]
    numel: Annotated[int, Field(ge=0)]


class TuningReport(Strict):
    kernel: KernelName
    shape: ShapeText
    dtype: DType
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    strategy: Annotated[str, Field(max_length=32)] = ""
    env: ReportEnv
    trials: Annotated[list[ReportTrial], Field(min_length=1, max_length=MAX_TRIALS)]
    best_config_key: Annotated[str, Field(min_length=1, max_length=256)] | None
    golden: Golden
    measured_at: Annotated[AwareDatetime | None, Field(
        strict=False,  # an ISO 8601 string in JSON
        description="when the worker finished measuring (its clock, UTC offset required); "
                    "reports from before this field import without it, marked undated")] = None
    revision: Annotated[str | None, Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+\-]*$",
        description="the kernels' source revision: a git commit (optionally with -dirty) or the "
                    "package version")] = None

    @model_validator(mode="after")
    def _best_is_a_trial(self) -> TuningReport:
        keys = [t.config_key for t in self.trials]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"config_key {dup!r} appears in more than one trial")
        if self.best_config_key is not None:
            ok = {t.config_key for t in self.trials if t.status == "ok"}
            if self.best_config_key not in ok:
                raise ValueError(f"best_config_key {self.best_config_key!r} is not a trial with status ok")
        return self

    def digest(self) -> str:
        """SHA-256 of the canonical JSON form (sorted keys, no spaces): the payload digest. A report
        without a revision digests as before the field existed (re-imports stay duplicates)."""
        return canonical_digest(self.model_dump(mode="json", exclude={"revision"} if self.revision is None
                                                else None))


def canonical_digest(data: Any) -> str:
    """SHA-256 of ``data``'s canonical JSON (:mod:`kernelfleet.service.canonical`; its floats finite)."""
    return hashlib.sha256(canonical_json(data)).hexdigest()


# ---- health ----

class Health(BaseModel):
    status: Literal["ok", "degraded"]
    database: Literal["ok", "unreachable", "read-only", "unresponsive"]
    detail: str | None = None


# ---- enrollment and workers ----

class EnrollTokenIn(Strict):
    ttl_seconds: Annotated[float, Field(gt=0, le=30 * 24 * 3600)] | None = None
    uses: Annotated[int, Field(ge=1, le=MAX_TOKEN_USES, description="workers it may enroll (one per GPU)")
                    ] = 1


class EnrollTokenOut(BaseModel):
    token: str
    expires_at: UtcTime
    uses: int = 1


class AddWorkerIn(Strict):
    gpus: Annotated[int, Field(ge=1, le=MAX_TOKEN_USES, description="agents on the host (one per GPU)")] = 1
    ttl_seconds: Annotated[float, Field(gt=0, le=30 * 24 * 3600)] | None = None


class StepOut(BaseModel):
    what: str
    command: str


class PlatformOut(BaseModel):
    key: str  # macos | linux-cuda
    title: str
    steps: list[StepOut]
    alternatives: list[StepOut]


class AddWorkerOut(BaseModel):
    """How to install and enroll a new machine, with a fresh enrollment token for ``uses`` workers."""

    public_url: str
    wheel_url: str
    token: str
    expires_at: UtcTime
    uses: int
    platforms: list[PlatformOut]
    notes: list[str]


class TokenIn(Strict):
    name: Name
    scope: Literal["admin", "read", "enroll"]


class TokenOut(BaseModel):
    """An API token as listed: never the token itself (only its digest is stored)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    scope: str
    created_at: UtcTime
    revoked_at: OptUtcTime = None


class TokenCreatedOut(TokenOut):
    token: str  # shown this once


class EnrollIn(Strict):
    enrollment_token: Token
    name: Name
    chip: Name
    backend: BackendName
    gpu_cores: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    memory_bytes: Annotated[int, Field(ge=0, le=MAX_MEMORY_BYTES)] | None = None
    os: ShortText = ""
    mlx_version: Annotated[str, Field(max_length=64)] = ""
    driver: ShortText | None = None


class EnrollOut(BaseModel):
    worker_id: int
    token: str


class WorkerOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    chip: str
    backend: str
    gpu_cores: int | None
    memory_bytes: int | None
    os: str
    mlx_version: str
    driver: str | None
    created_at: UtcTime
    last_heartbeat_at: OptUtcTime
    revoked_at: OptUtcTime
    # online | offline | revoked, as the dashboard shows it (service/worker_status.py); GET /workers only
    status: Literal["online", "offline", "revoked"] | None = None


# ---- campaigns and jobs ----

RUNTIME_WORKLOADS = ["prefill:2048", "decode:1", "decode:8"]
MAX_MODEL_CONFIG = 64 * 1024  # characters of a model's config.json in a campaign (llama-3-8b's: ~1 KB)


class RuntimeSettingsPlan(Strict):
    """A campaign's runtime-settings jobs: one per quantization and chip
    (:func:`kernelfleet.service.campaigns.runtime_targets`), each the search of ``kernelfleet settings
    tune`` for ``config``'s model at every workload (one fresh process per setting, paired against
    MLX's defaults with a control), run by the worker that leases it within that worker's budget, its
    result stored as the worker's chip's runtime settings."""

    config: Annotated[dict[str, Any], Field(description="the model's config.json (mlx-lm / Hugging Face)")]
    quantizations: Annotated[list[Literal["bf16", "4bit", "8bit"]], Field(
        min_length=1, max_length=3, description="the model's weights: bf16, or quantized as "
                                                "mlx_lm.convert does; one job each")] = ["bf16"]
    workloads: Annotated[list[Workload], Field(min_length=1, max_length=8)] = RUNTIME_WORKLOADS
    layers: Annotated[int, Field(ge=0, le=1024, description="decoder layers built (0: the config's)")] = 0
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    context: Annotated[int, Field(ge=1, le=131_072, description="tokens in the KV cache before decode")] = 512
    steps: Annotated[int, Field(ge=1, le=10_000, description="decode steps timed per measurement")] = 64
    reps: Annotated[int, Field(ge=1, le=100, description="measurements per process")] = 3
    rounds: Annotated[int, Field(ge=3, le=100, description="rounds per stage (at least 3)")] = 5

    @model_validator(mode="after")
    def _runnable(self) -> RuntimeSettingsPlan:
        for label, values in (("quantizations", self.quantizations), ("workloads", self.workloads)):
            if len(set(values)) != len(values):
                raise ValueError(f"runtime_settings.{label} lists the same value twice")
        if len(json.dumps(self.config)) > MAX_MODEL_CONFIG:
            raise ValueError(f"runtime_settings.config: above {MAX_MODEL_CONFIG} characters; a model's "
                             f"config.json is a few KB")
        from kernelfleet.kernels.patch.model_shapes import ModelConfigError, derive

        try:
            derive(self.config)  # the same refusals as `campaign create --from-model`
        except ModelConfigError as e:
            raise ValueError(f"runtime_settings.config: {e}") from None
        except (TypeError, KeyError, AttributeError, IndexError) as e:  # a field of an unexpected type
            raise ValueError(f"runtime_settings.config: not a model's config.json ({type(e).__name__}: "
                             f"{e})") from None
        if self.layers:
            self.config["num_hidden_layers"] = min(self.layers, int(self.config["num_hidden_layers"]))
            self.layers = 0
        return self

    def job_dtypes(self) -> list[str]:
        """The jobs' dtypes: each quantization's entry label
        (:func:`kernelfleet.runtime_settings_file.dtype_label`)."""
        from kernelfleet.runtime_settings_file import dtype_label

        return [dtype_label(q, self.compute_dtype) for q in self.quantizations]


class CampaignIn(Strict):
    """Either ``kernels`` x ``shapes`` (every kernel at every shape) or ``kernel_shapes`` (each kernel
    with its own shapes, e.g. a model's calls); either way x ``dtypes``."""

    name: Name
    kernels: Annotated[list[KernelName], Field(min_length=1, max_length=64)] | None = None
    shapes: Annotated[list[ShapeText], Field(min_length=1, max_length=64)] | None = None
    # a quantized model plans one shape per (layer format, token count): 256 a kernel, not 64
    kernel_shapes: Annotated[dict[KernelName,
                                  Annotated[list[ShapeText], Field(min_length=1, max_length=256)]],
                             Field(min_length=1, max_length=64,
                                   description="kernel -> its own shapes (instead of kernels x shapes)")
                             ] | None = None
    dtypes: Annotated[list[DType], Field(max_length=3, description="the kernels' dtypes (at least one "
                                        "with kernels)")] = []
    runtime_settings: Annotated[RuntimeSettingsPlan | None, Field(
        description="also (or only) search MLX's runtime settings for a model: one job per quantization "
                    "and enrolled chip the campaign targets")
    ] = None
    target_backend: BackendName | None = None
    target_chip: Annotated[str, Field(min_length=1, max_length=128,
                                      description="chip name or glob, e.g. 'Apple M3*'")] | None = None
    max_attempts: Annotated[int, Field(ge=1, le=100)] | None = None

    @model_validator(mode="after")
    def _bounded(self) -> CampaignIn:
        pair = self.kernels is not None or self.shapes is not None
        if self.kernel_shapes is not None and pair:
            raise ValueError("give either kernels and shapes, or kernel_shapes, not both")
        if self.runtime_settings is not None and self.kernel_shapes is None and not pair:
            if self.dtypes:
                raise ValueError("dtypes are the kernels' dtypes: give kernels too, or drop dtypes (runtime "
                                 "settings take runtime_settings.quantizations)")
            return self  # runtime settings only
        if self.kernel_shapes is None and (self.kernels is None or self.shapes is None):
            raise ValueError("give kernels and shapes, or kernel_shapes" + (
                "" if self.runtime_settings is None else " (or neither, for runtime settings only)"))
        if not self.dtypes:
            raise ValueError("dtypes: give at least one (the kernels' dtypes)")
        lists: dict[str, list[str]] = {"dtypes": list(self.dtypes)}
        if self.kernel_shapes is None:
            lists.update(kernels=self.kernels or [], shapes=self.shapes or [])
        else:
            lists.update({f"kernel_shapes[{k!r}]": v for k, v in self.kernel_shapes.items()})
        for label, values in lists.items():
            if len(set(values)) != len(values):
                raise ValueError(f"{label} lists the same value twice")
        n = sum(len(s) for s in self.shape_sets().values()) * len(self.dtypes)
        if n > MAX_CAMPAIGN_JOBS:
            raise ValueError(f"this campaign would create {n} jobs; the limit is {MAX_CAMPAIGN_JOBS}")
        _check_against_catalog(self.shape_sets(), self.dtypes)
        self.target_backend = _backend_for(list(self.shape_sets()), self.target_backend, self.target_chip)
        return self

    def shape_sets(self) -> dict[str, list[str]]:
        """kernel -> its shapes, whichever form the campaign was given in ({}: runtime settings only)."""
        if self.kernel_shapes is not None:
            return self.kernel_shapes
        return {k: list(self.shapes or []) for k in self.kernels or []}


def _check_against_catalog(kernel_shapes: dict[str, list[str]], dtypes: Sequence[str]) -> None:
    """Refuse a campaign whose jobs no worker could run: unknown kernels, shapes a kernel rejects
    (e.g. rope wants batch x heads x seq x dim) or too large for any machine, dtypes it does not
    support (:mod:`kernelfleet.service.campaign_checks`, which the CLI runs before it prints a plan)."""
    from kernelfleet.service.campaign_checks import problems

    found = problems(kernel_shapes, dtypes)
    if found:
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise ValueError("; ".join(found[:5]) + more)


def _backend_for(kernels: Sequence[str], target: str | None, chip: str | None) -> Any:
    from kernelfleet.service.campaign_checks import backend_for

    return backend_for(kernels, target, chip)


class Progress(BaseModel):
    total: int = 0
    queued: int = 0
    leased: int = 0
    done: int = 0
    dead: int = 0
    cancelled: int = 0


class CampaignOut(BaseModel):
    id: int
    name: str
    kernels: list[str]
    shapes: list[str]  # every shape of the campaign (each kernel's own: kernel_shapes)
    kernel_shapes: dict[str, list[str]]
    dtypes: list[str]
    target_backend: str | None
    target_chip: str | None
    max_attempts: int
    created_at: UtcTime
    progress: Progress
    cancelled_at: OptUtcTime = None
    # e.g. no enrolled worker matches the target (set when the campaign is created)
    warnings: list[str] = Field(default_factory=list)


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    campaign_id: int | None
    kind: str
    kernel: str
    shape: str
    dtype: str
    target_backend: str | None
    target_chip: str | None
    state: str
    attempts: int
    max_attempts: int
    leased_by: int | None
    lease_confirmed: bool  # the leasing worker's first heartbeat arrived
    lease_expires_at: OptUtcTime
    available_at: UtcTime
    created_at: UtcTime
    updated_at: UtcTime
    finished_at: OptUtcTime
    last_error: str | None


# ---- leasing ----

class LeaseIn(Strict):
    # wait up to this long for work when none is queued (long-poll); the coordinator caps it at
    # KERNELFLEET_LEASE_WAIT_MAX_SECONDS
    wait_seconds: Annotated[float, Field(ge=0.0, le=3600.0)] = 0.0


class LeaseOut(BaseModel):
    job_id: int
    lease_token: str
    kernel: str
    shape: str
    dtype: str
    kind: str  # tune, confirm (a regression's re-run), runtime_settings
    lease_expires_at: UtcTime  # a first, short deadline: confirm the lease with a heartbeat before it
    lease_seconds: float
    # a runtime_settings job's search: its campaign's runtime_settings (config, workloads, ...) with
    # this job's quantization; None for other kinds
    runtime_settings: dict[str, Any] | None = None


class LeaseTokenIn(Strict):
    lease_token: Token


class HeartbeatOut(BaseModel):
    lease_expires_at: UtcTime
    # when to send the next one: the coordinator spreads the fleet's heartbeats (a random share of a
    # third of the lease), so that workers leased in one burst do not beat in waves for ever after
    next_heartbeat_seconds: float | None = None


class CompleteIn(Strict):
    """A job's result: a tuning ``report`` (kinds tune and confirm), or the ``runtime_settings`` file a
    runtime_settings job chose (stored as the chip's runtime settings)."""

    lease_token: Token
    report: TuningReport | None = None
    runtime_settings: RuntimeSettingsFile | None = None

    @model_validator(mode="after")
    def _one(self) -> CompleteIn:
        if (self.report is None) == (self.runtime_settings is None):
            raise ValueError("give a report (a tuning job's) or runtime_settings (a runtime_settings job's)")
        return self


class CompleteOut(BaseModel):
    """A tuning job's ``result_id``, or a runtime_settings job's ``stored`` entries (the other absent)."""

    result_id: int | None = None
    job_id: int
    state: Literal["done"] = "done"
    stored: int | None = None


class FailIn(Strict):
    lease_token: Token
    error: Annotated[str, Field(min_length=1, max_length=8000)]


class JobTransitionOut(BaseModel):
    job_id: int
    state: str
    attempts: int
    max_attempts: int
    available_at: OptUtcTime = None


# ---- import ----

class ImportIn(Strict):
    reports: Annotated[list[TuningReport], Field(min_length=1, max_length=1000)]


class ImportOut(BaseModel):
    imported: int  # newly stored
    duplicates: int = 0  # already stored before (the same report imported again): not stored twice
    result_ids: list[int]  # one per report, in order: the new row, or the one stored before


# ---- runtime settings (kernelfleet/runtime_settings_file.py's format) ----

RUNTIME_SETTINGS_SCHEMA = "kernelfleet-runtime-settings/1"
Gain = Annotated[float, Field(gt=0.0, le=1000.0)]
Interval = Annotated[list[Gain], Field(min_length=2, max_length=2)]
EnvName = Annotated[str, Field(min_length=5, max_length=64, pattern=r"^MLX_[A-Z0-9_]+$",
                                description="an MLX environment variable, e.g. MLX_MAX_OPS_PER_BUFFER")]
EnvValue = Annotated[str, Field(max_length=64)]


class RuntimeControl(Strict):
    gain: Gain
    interval: Interval | None = None


class RuntimeEvidence(Strict):
    stage: ShortText
    settings: Annotated[dict[EnvName, EnvValue], Field(max_length=16)]
    gain: Gain
    interval: Interval | None = None
    verdict: ShortText | None = None
    rounds: Annotated[int, Field(ge=0, le=10_000)] = 0
    bit_identical: bool | None = None


class RuntimeEntry(Strict):
    """One chosen setting: ``settings`` {} keeps MLX's defaults (``note`` says why)."""

    model: Name
    dtype: Annotated[str, Field(min_length=1, max_length=16)]
    workload: Workload
    settings: Annotated[dict[EnvName, EnvValue], Field(max_length=16)]
    gain: Gain = 1.0
    interval: Interval | None = None
    verdict: ShortText | None = None
    bit_identical: bool | None = None
    rounds: Annotated[int, Field(ge=0, le=10_000)] = 0
    control: RuntimeControl | None = None
    evidence: Annotated[list[RuntimeEvidence], Field(max_length=512)] = []
    # the gain in each confirmation round (the control's, where MLX's defaults stay): compared across
    # MLX versions by the coordinator (service/runtime_settings.py)
    round_gains: Annotated[list[Gain], Field(max_length=1000)] = []
    note: Annotated[str, Field(max_length=2000)] = ""


class RuntimeSettingsFile(Strict):
    """A runtime-settings file, as ``kernelfleet settings tune`` writes it and ``pull`` installs it."""

    schema_: Annotated[Literal["kernelfleet-runtime-settings/1"], Field(alias="schema")]
    chip: Name
    backend: BackendName
    arch: ShortText | None = None
    mlx_version: Annotated[str, Field(min_length=1, max_length=64)]
    entries: Annotated[list[RuntimeEntry], Field(min_length=1, max_length=256)]

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, populate_by_name=True)


class RuntimeSettingsPushed(BaseModel):
    chip: str
    mlx_version: str
    stored: int  # entries stored (new keys and replaced ones)


CompleteIn.model_rebuild()  # its runtime_settings is defined after it
