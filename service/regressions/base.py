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
    robust: bool = True  # it holds with any one bad run or bad pair among its slower runs left out


def same_change(
    alert: int,
    alert_levels: tuple[float, float],
    finding: int,
    finding_levels: tuple[float, float],
    medians: Sequence[float],
    min_effect: float,
    near: int = 2,
    late: int = 10,
) -> bool:
    """Whether an existing alert (first slower run, (baseline, new) medians) already covers a scan
    finding in the same runs (``medians``, one per run):

    - they are at most ``near`` runs apart;
    - the alert came up to ``late`` runs after the finding from at least the finding's baseline
      level (the online detector saw the change, or the rest of a ramp, a few runs late);
    - the alert came up to ``late`` runs before the finding and the runs in between (after the
      alert's own suspect and confirmation) stayed slower than the alert's baseline (the slowdown
      it reported went on rising).

    A false alert that the runs after it contradicted (they went back to its baseline) covers
    nothing after it, so it does not hide a real step nearby."""
    gap = alert - finding
    if abs(gap) <= near:
        return True
    tolerance = float(np.log1p(min_effect / 2))
    if 0 < gap <= late:
        return float(np.log(alert_levels[0] / finding_levels[0])) >= -tolerance
    if 0 < -gap <= late:  # the runs after the alert's own two (suspect and confirmation)
        between = np.log(np.asarray(medians[alert + 2 : finding], dtype=float))
        return bool(np.median(between) >= np.log(alert_levels[0]) + tolerance)
    return False


def relocates(alert: int, finding: Finding, min_effect: float = 0.03) -> bool:
    """Whether the scan's ``finding`` of the same change moves an alert's first slower run: one run
    off, for a change of at least twice ``min_effect`` (the online detector, seeing only runs
    before it, can take a high run just before a step for its start; the scan sees both sides)."""
    return abs(alert - finding.index) == 1 and finding.effect >= 2 * min_effect


class OnlineDetector(Protocol):
    """Looks at each new run as it arrives against the series' recent history."""

    name: str

    def check(self, history: Sequence[RunPoint], new: RunPoint, min_effect: float) -> Finding | None:
        """A finding when ``new`` is slower than ``history`` beyond the noise and ``min_effect``."""
        ...

    def confirms(
        self, history: Sequence[RunPoint], suspect: Finding, rerun: RunPoint, min_effect: float
    ) -> Finding | None:
        """The suspect re-estimated with its confirmation re-run when that reproduces it, else None.
        ``history``: the runs since the baseline started up to the re-run, the suspect's slower runs
        (from ``suspect.index`` on) and any stored since included."""
        ...


    def shift_at(self, runs: Sequence[RunPoint], tau: int, min_effect: float) -> Finding | None:
        """A finding when ``runs[tau:]`` are slower than ``runs[:tau]`` beyond the noise and
        ``min_effect``, the change known to lie at ``tau`` (e.g. an MLX upgrade between two groups
        of paired rounds: :mod:`kernelfleet.service.runtime_settings`)."""
        ...

    def settled(self, joint: Finding, runs: int) -> bool:
        """Whether ``joint`` (from :meth:`confirms`), resting on ``runs`` slower runs counting the
        re-run, is enough to alert; else the coordinator asks for one more re-run."""
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
