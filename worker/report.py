"""Checks a tuning report against the shared contract (stdlib only; used by tests, benchmarks
and before writing ``--out`` lines). The coordinator has its own pydantic models; this is the
worker's self-check."""

from __future__ import annotations

import math
import re
from typing import Any

from kernelfleet.worker.revision import REVISION_RE

STATUSES = {"ok", "compile_error", "launch_error", "mismatch", "unsupported"}
BACKENDS = {"metal", "cuda", "cpu"}
MAX_TRIALS, MAX_SAMPLES, MAX_GOLDEN_SAMPLE = 512, 1000, 256
_TOP = {"kernel", "shape", "dtype", "seed", "strategy", "env", "trials", "best_config_key", "golden"}
# measured_at: ISO 8601 UTC, the worker's clock when it finished measuring; revision: the kernels' source
_OPTIONAL_TOP = {"measured_at", "revision"}
_ENV = {"chip", "backend", "mlx_version", "os", "driver", "kernel_hash", "gpu_cores", "memory_bytes"}
_TRIAL = {"config_key", "config", "is_builtin", "status", "error", "samples_us", "median_us", "p10_us",
          "p90_us", "n", "max_abs_err", "max_rel_err"}
# shares_measurement_with: the config measured for this one (identical kernels: worker/measure.py)
_OPTIONAL_TRIAL = {"shares_measurement_with"}
_GOLDEN = {"digest", "stats", "sample", "stride", "numel"}
_STATS = {"mean", "std", "min", "max", "abs_mean"}


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _opt_num(x: Any) -> bool:
    return x is None or _num(x)


def report_problems(report: dict[str, Any]) -> list[str]:
    """Every way ``report`` departs from the contract (empty list: valid)."""
    p: list[str] = []
    if not _TOP <= set(report) <= _TOP | _OPTIONAL_TOP:
        p.append(f"top-level keys {sorted((set(report) - _OPTIONAL_TOP) ^ _TOP)} differ from the contract")
    if "measured_at" in report and not re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)",
                                                    str(report["measured_at"])):
        p.append("measured_at must be an ISO 8601 time with its UTC offset")
    if "revision" in report and not REVISION_RE.match(str(report["revision"])):
        p.append("revision must be 1-64 letters, digits and . _ + - (a git commit or a version)")
    for k in ("kernel", "shape", "dtype", "strategy", "best_config_key"):
        if not isinstance(report.get(k), str) or not report.get(k):
            p.append(f"{k} must be a non-empty string")
    if not re.fullmatch(r"\d+(x\d+)*", str(report.get("shape", ""))):
        p.append("shape must look like 4096x4096")
    if not isinstance(report.get("seed"), int):
        p.append("seed must be an int")
    env = report.get("env") or {}
    if set(env) != _ENV:
        p.append(f"env keys {sorted(set(env) ^ _ENV)} differ from the contract")
    if env.get("backend") not in BACKENDS:
        p.append(f"env.backend {env.get('backend')!r} is not one of {sorted(BACKENDS)}")
    for k in ("chip", "mlx_version", "os", "kernel_hash"):
        if not isinstance(env.get(k), str) or not env.get(k):
            p.append(f"env.{k} must be a non-empty string")
    for k in ("gpu_cores", "memory_bytes"):
        if env.get(k) is not None and not isinstance(env.get(k), int):
            p.append(f"env.{k} must be an int or null")
    trials = report.get("trials") or []
    if not 1 <= len(trials) <= MAX_TRIALS:
        p.append(f"trials must hold 1..{MAX_TRIALS} entries")
    keys = []
    for i, t in enumerate(trials):
        keys.append(t.get("config_key"))
        if not _TRIAL <= set(t) <= _TRIAL | _OPTIONAL_TRIAL:
            wrong = sorted((set(t) - _OPTIONAL_TRIAL) ^ _TRIAL)
            p.append(f"trial {i}: keys {wrong} differ from the contract")
            continue
        if "shares_measurement_with" in t and not (isinstance(t["shares_measurement_with"], str)
                                                   and t["shares_measurement_with"]):
            p.append(f"trial {i}: shares_measurement_with must be a config key")
        if t["status"] not in STATUSES:
            p.append(f"trial {i}: status {t['status']!r}")
        if t["is_builtin"] != (t["config_key"] == "builtin"):
            p.append(f"trial {i}: is_builtin disagrees with config_key")
        if not all(_opt_num(t[k]) for k in ("median_us", "p10_us", "p90_us", "max_abs_err", "max_rel_err")):
            p.append(f"trial {i}: timings/errors must be finite numbers or null")
        if t["status"] == "ok":
            if not (t["n"] >= 1 and _num(t["median_us"]) and t["p10_us"] <= t["median_us"] <= t["p90_us"]):
                p.append(f"trial {i}: an ok trial needs n >= 1 and p10 <= median <= p90")
            s = t["samples_us"]
            if s is not None and (len(s) != t["n"] or len(s) > MAX_SAMPLES or not all(_num(v) for v in s)):
                p.append(f"trial {i}: samples_us must hold n finite values (<= {MAX_SAMPLES})")
        else:
            if t["n"] != 0 or any(t[k] is not None for k in ("median_us", "p10_us", "p90_us")):
                p.append(f"trial {i}: a failed trial has null timings and n 0")
            if not t["error"]:
                p.append(f"trial {i}: a failed trial carries its error message")
    if len(set(keys)) != len(keys):
        p.append("config keys repeat")
    best = next((t for t in trials if t.get("config_key") == report.get("best_config_key")), None)
    if best is None or best.get("status") != "ok":
        p.append("best_config_key must name an ok trial")
    g = report.get("golden") or {}
    if set(g) != _GOLDEN or set(g.get("stats") or {}) != _STATS:
        p.append("golden keys differ from the contract")
    else:
        if not re.fullmatch(r"[0-9a-f]{64}", str(g["digest"])):
            p.append("golden.digest must be sha256 hex")
        if not (len(g["sample"]) <= MAX_GOLDEN_SAMPLE and all(_num(v) for v in g["sample"])):
            p.append("golden.sample must hold <= 256 finite values")
        if not all(_num(v) for v in g["stats"].values()):
            p.append("golden.stats must be finite")
        if not all(isinstance(g[k], int) and g[k] >= 1 for k in ("stride", "numel")):
            p.append("golden.stride and numel must be positive ints")
    return p
