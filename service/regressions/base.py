"""Run points, findings, the two detector interfaces and their registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

# attributes of a run that may explain a regression, in the order attribution reports them
ATTRIBUTES = ("mlx_version", "revision", "os", "driver", "kernel_hash", "config_key", "worker")


@dataclass(frozen=True)
class RunPoint:
    """One run of a series: the time of the variant it chose, its raw samples and its environment."""

    median_us: float
    samples_us: tuple[float, ...] | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    n: int = 0
    attrs: Mapping[str, str | None] = field(default_factory=dict)
    result_id: int | None = None

    @property
    def log_median(self) -> float:
        return float(np.log(self.median_us))

    @cached_property
    def median_se(self) -> float:
        """Standard error of this run's median in log space (see :func:`.noise.within_run_se`)."""
        from kernelfleet.service.regressions.noise import within_run_se

        return within_run_se(self)


@dataclass(frozen=True)
class Finding:
    """A suspected regression: the series got slower from run ``index`` on."""

    detector: str
    index: int  # first run at the new (slower) level, an index into the runs given to the detector
    baseline_median_us: float
    new_median_us: float
    effect: float  # new / baseline - 1
    p_value: float
    baseline_indices: tuple[int, ...] = ()  # the runs the baseline was computed from


class OnlineDetector(Protocol):
    """Looks at each new run as it arrives against the series' recent history."""

    name: str

    def check(self, history: Sequence[RunPoint], new: RunPoint, min_effect: float) -> Finding | None:
        """A finding when ``new`` is slower than ``history`` beyond the noise and ``min_effect``."""
        ...

    def confirms(
        self, history: Sequence[RunPoint], suspect: Finding, rerun: RunPoint, min_effect: float
    ) -> bool:
        """Whether a confirmation re-run reproduces ``suspect`` (same baseline ``history``)."""
        ...


class OfflineDetector(Protocol):
    """Looks at a whole series at once (gradual drift that no single step reveals)."""

    name: str

    def scan(self, runs: Sequence[RunPoint], min_effect: float) -> list[Finding]:
        """Every slowdown of at least ``min_effect`` found in ``runs`` (oldest first)."""
        ...


class DetectorError(Exception):
    """Base class of the regression package's errors."""


class UnknownDetector(DetectorError):
    pass


_ONLINE: dict[str, OnlineDetector] = {}
_OFFLINE: dict[str, OfflineDetector] = {}


def register_online(detector: OnlineDetector) -> OnlineDetector:
    _ONLINE[detector.name] = detector
    return detector


def register_offline(detector: OfflineDetector) -> OfflineDetector:
    _OFFLINE[detector.name] = detector
    return detector


def online(name: str = "step") -> OnlineDetector:
    _load_builtin()
    try:
        return _ONLINE[name]
    except KeyError:
        raise UnknownDetector(f"no online detector {name!r}; known: {', '.join(sorted(_ONLINE))}") from None


def offline(name: str = "changepoint") -> OfflineDetector:
    _load_builtin()
    try:
        return _OFFLINE[name]
    except KeyError:
        raise UnknownDetector(f"no offline detector {name!r}; known: {', '.join(sorted(_OFFLINE))}") from None


def _load_builtin() -> None:
    # the built-in detectors register themselves on import
    from kernelfleet.service.regressions import changepoint, step  # noqa: F401
