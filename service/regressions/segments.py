"""The two-level test shared by the online detector and the scan: is ``runs[tau:]`` slower than
``runs[:tau]``?

Short or young series are the hard case: two or three runs say little about how much a run's
median wanders from run to run. So the run-to-run sigma is a pooled estimate: what the runs
themselves show (robust, from differences of consecutive runs inside each level, so neither the
step nor one bad run inflates it) shrunk towards a prior sigma with ``prior_df`` degrees of freedom
(a scaled-inverse-chi-square prior), and floored by the within-run error of the runs' medians.
The difference of the two levels' medians is then a Student-t statistic with the pooled degrees of
freedom, and the variance of a median of ``n`` runs gets its small-sample factor (1 for one or two
runs, up to pi/2 for many). With ``Prior.trim`` (the scan's), a level of three or more runs is
instead the mean of its runs within ``trim`` sigmas of its median (a bad run left out), with a
mean's variance.

One bad run must not make a step: every run on the slower side has to be at least ``floor`` above
the faster level, and the level difference at least ``min_effect``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernelfleet.service.regressions.base import RunPoint
from kernelfleet.service.regressions.noise import MAD_TO_SIGMA, SCALE_FLOOR

# variance of the median of n normal values, in units of sigma^2 / n (exact for n <= 5, then -> pi/2)
_MEDIAN_VAR = {1: 1.0, 2: 1.0, 3: 1.35, 4: 1.19, 5: 1.43}


def median_var_factor(n: int) -> float:
    return _MEDIAN_VAR.get(n, float(np.pi / 2))


@dataclass(frozen=True)
class Prior:
    """What a run's median is expected to wander from run to run before a series shows its own."""

    sigma: float = 0.015  # log units (1.5 %)
    df: float = 8.0
    pair_clip: float = 2.0  # two slower runs: the slower counts at most this many sigmas above the other
    pair_spread: float = 4.0  # two slower runs further apart than this many sigmas (+ half the step)
    # are no one level
    level_sigmas: float = 0.5  # a slower run more sigmas below the levels' midpoint is not at the new level
    trim: float = 0.0  # > 0: each level of 3 or more runs is the mean of its runs within this many
    # sigmas of its median (a bad run left out), not the median (see _trimmed_level)


def _level(x: np.ndarray, sigma: float, clip: float) -> float:
    """The median of ``x``; of two runs, their mean with the slower clipped to ``clip`` sigmas above
    the faster (so a spike and a normal re-run do not average into a step)."""
    if len(x) == 2:
        low = float(x.min())
        return (low + min(float(x.max()), low + clip * sigma)) / 2
    return float(np.median(x))


def _trimmed_level(x: np.ndarray, sigma: float, trim: float) -> tuple[float, float]:
    """A level and its variance factor (in units of sigma^2 / len(x)): the mean of the runs within
    ``trim`` sigmas of their median, when at least 3 are, else the median. The median of many runs
    wastes a third of their information (variance pi/2 sigma^2 / n); leaving out only the runs far
    from it (bad runs) keeps the robustness and most of a mean's precision."""
    m = float(np.median(x))
    keep = x[np.abs(x - m) <= trim * sigma]
    if len(x) < 3 or len(keep) < 3:
        return m, median_var_factor(len(x))
    return float(keep.mean()), len(x) / len(keep)


@dataclass(frozen=True)
class LevelShift:
    tau: int  # first run of the slower level
    before: float  # log median of runs[:tau]
    after: float  # log median of runs[tau:]
    sigma: float  # pooled run-to-run sigma
    df: float
    t: float
    p_value: float

    @property
    def effect(self) -> float:
        return float(np.exp(self.after - self.before) - 1.0)


def cusum_stat(x: np.ndarray, min_segment: int) -> np.ndarray:
    """|mean(left) - mean(right)| / sqrt(1/nl + 1/nr) for every split of each row of ``x``."""
    m = x.shape[-1]
    csum = np.cumsum(x, axis=-1)
    total = csum[..., -1:]
    taus = np.arange(min_segment, m - min_segment + 1)
    left = csum[..., taus - 1]
    nl = taus.astype(float)
    nr = m - nl
    diff = left / nl - (total - left) / nr
    result: np.ndarray = np.abs(diff) / np.sqrt(1.0 / nl + 1.0 / nr)
    return result


def robust_sigma(x: np.ndarray) -> float:
    """Run-to-run sigma of log medians from first differences (which a level shift hardly moves)."""
    diffs = np.diff(x)
    spread = float(np.median(np.abs(diffs - np.median(diffs)))) if len(diffs) else 0.0
    return max(MAD_TO_SIGMA * spread / np.sqrt(2), SCALE_FLOOR)


def tame(x: np.ndarray, clip_sigmas: float = 3.0, clip_up: float | None = None) -> np.ndarray:
    """Each log median clipped to its rolling median (5 runs) minus ``clip_sigmas`` and plus
    ``clip_up`` (``clip_sigmas`` unless given) robust sigmas, so a single bad run cannot make (or
    place) a change point. Bad runs are only slower than their level (a device's state: clocks, heat,
    other load), so a run far above its neighbours is clipped closer than one below them."""
    from scipy.ndimage import median_filter  # here, not at import: scipy is most of a coordinator's start

    rolling = median_filter(x, size=5, mode="nearest")
    sigma = robust_sigma(x)
    up = clip_sigmas if clip_up is None else clip_up
    clipped: np.ndarray = np.clip(x, rolling - clip_sigmas * sigma, rolling + up * sigma)
    return clipped


def _diffs(x: np.ndarray, bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    parts = [np.diff(x[a:b]) for a, b in bounds if b - a >= 2]
    return np.concatenate(parts) if parts else np.zeros(0)


def pooled_sigma(x: np.ndarray, bounds: Sequence[tuple[int, int]], within: float, prior: Prior) -> tuple[
    float, float
]:
    """Run-to-run sigma of log medians (and its degrees of freedom) from consecutive differences
    inside each segment of ``bounds``, shrunk towards ``prior`` and floored by ``within``."""
    d = _diffs(x, bounds)
    k = float(len(d))
    if k:
        # median |difference| of two normal values = 0.6745 * sqrt(2) sigma; robust to a bad run
        own = MAD_TO_SIGMA * float(np.median(np.abs(d))) / np.sqrt(2)
        # a robust estimate carries about 40 % of the information of the same number of squares
        k_eff = 0.4 * k
    else:
        own, k_eff = 0.0, 0.0
    var = (prior.df * prior.sigma**2 + k_eff * own**2) / (prior.df + k_eff)
    return max(float(np.sqrt(var)), within, SCALE_FLOOR), prior.df + k_eff


def level_shift(
    runs: Sequence[RunPoint], tau: int, prior: Prior, x: np.ndarray | None = None
) -> LevelShift:
    """The test of a slowdown from ``runs[tau]`` on (``0 < tau < len(runs)``)."""
    if x is None:
        x = np.array([p.log_median for p in runs], dtype=float)
    n = len(x)
    if not 0 < tau < n:
        raise ValueError(f"tau {tau} must split {n} runs")
    within = float(np.median([p.median_se for p in runs]))
    sigma, df = pooled_sigma(x, [(0, tau), (tau, n)], within, prior)
    before, after = float(np.median(x[:tau])), _level(x[tau:], sigma, prior.pair_clip)
    fb, fa = median_var_factor(tau), median_var_factor(n - tau)
    if prior.trim > 0:
        before, fb = _trimmed_level(x[:tau], sigma, prior.trim)
        if n - tau >= 3:
            after, fa = _trimmed_level(x[tau:], sigma, prior.trim)
    se = sigma * np.sqrt(fb / tau + fa / (n - tau))
    t = (after - before) / se
    from scipy import special  # here, not at import: scipy is most of a coordinator's start

    return LevelShift(
        tau=tau, before=before, after=after, sigma=sigma, df=df, t=float(t),
        p_value=float(special.stdtr(df, -t)),  # t.sf(t, df) without scipy.stats' per-call overhead
    )


def may_hold(x: np.ndarray, tau: int, floor: float) -> bool:
    """Whether every run from ``tau`` on is at least ``floor`` (relative) above the median of the runs
    before it: what :func:`slow_side_holds` requires, tested before the costlier
    :func:`level_shift`."""
    return bool(np.all(x[tau:] >= np.median(x[:tau]) + np.log1p(floor)))


def slow_side_holds(
    x: np.ndarray, shift: LevelShift, floor: float, pair_spread: float = np.inf, level_sigmas: float = np.inf
) -> bool:
    """Every run from ``tau`` on is at least ``floor`` (relative) slower than the faster level, so
    a single bad run next to normal ones is no step; two slower runs lie within ``pair_spread``
    sigmas plus half the step of each other (a spike next to a bad run is not one new level); and
    no slower run is more than ``level_sigmas`` sigmas below the midpoint of the two levels (it
    belongs to the new level, not to the old one: bad runs around an ordinary run do not lift it
    into a step; the effect, not each run, has to clear the minimum effect)."""
    slow = x[shift.tau :]
    gap = shift.after - shift.before
    allowed = pair_spread * shift.sigma + gap / 2
    if len(slow) == 2 and abs(float(slow[1] - slow[0])) > allowed:
        return False
    lowest = shift.before + max(np.log1p(floor), gap / 2 - level_sigmas * shift.sigma)
    return bool(np.all(slow >= lowest))


def fast_side_holds(x: np.ndarray, shift: LevelShift, floor: float) -> bool:
    """Every run before ``tau`` is at least ``floor`` (relative) faster than the slower level."""
    return bool(np.all(x[: shift.tau] <= shift.after - np.log1p(floor)))


def without_bad_stretch(
    runs: Sequence[RunPoint], x: np.ndarray, tau: int, longest: int = 2
) -> list[tuple[list[RunPoint], np.ndarray]]:
    """``runs`` (and their log medians ``x``) with each stretch of 1 to ``longest`` consecutive
    slower runs (from ``tau`` on) left out, as long as one slower run remains: what the slower level
    rests on if that stretch was a bad run or a bad pair. Bad runs come alone and in pairs, so two
    elevated runs must not confirm each other, nor a bad pair lift an ordinary run into a step."""
    out = []
    n = len(x)
    for width in range(1, longest + 1):
        for i in range(tau, n - width + 1):
            if n - tau - width < 1:
                continue
            keep = [j for j in range(n) if not i <= j < i + width]
            out.append(([runs[j] for j in keep], x[keep]))
    return out
