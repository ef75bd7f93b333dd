"""The noise model: how much a run's median moves from run to run, in log space.

The samples of one run only show the spread *within* that run; two runs of the same kernel on
the same chip differ by more (clocks, thermal state, placement, other load). So the baseline is
the history of per-run medians: its robust center (median) and robust scale (MAD), floored by
what the within-run spread alone implies for a median. A new run's median is then compared with
that predictive distribution, with Student-t tails for the few runs the scale was estimated from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernelfleet.service.regressions.base import RunPoint

MAD_TO_SIGMA = 1.4826
IQR_TO_SIGMA = 1.0 / 1.349
P10_P90_TO_SIGMA = 1.0 / 2.5631
MEDIAN_SE_FACTOR = 1.2533  # standard error of a median = 1.2533 * sigma / sqrt(n) for normal data
SCALE_FLOOR = 0.002  # 0.2 %: timers and clocks do not resolve better than this


def within_run_se(point: RunPoint) -> float:
    """Standard error of the run's median in log space, from its samples (or p10/p90 when capped)."""
    if point.samples_us is not None and len(point.samples_us) >= 4:
        logs = np.log(np.asarray(point.samples_us, dtype=float))
        q25, q75 = np.percentile(logs, [25, 75])
        sigma = float(q75 - q25) * IQR_TO_SIGMA
        n = len(logs)
    elif point.p10_us and point.p90_us and point.n >= 2:
        sigma = float(np.log(point.p90_us) - np.log(point.p10_us)) * P10_P90_TO_SIGMA
        n = point.n
    else:
        return SCALE_FLOOR
    return max(MEDIAN_SE_FACTOR * sigma / np.sqrt(n), SCALE_FLOOR / 4)


@dataclass(frozen=True)
class Baseline:
    center: float  # log of the baseline median time
    scale: float  # run-to-run sigma of log run medians
    k: int  # how many runs it rests on

    @property
    def median_us(self) -> float:
        return float(np.exp(self.center))

    def predictive_sigma(self, new_se: float = 0.0) -> float:
        """Sigma of a new run's log median around ``center``: run-to-run noise, the uncertainty of
        the center itself (a median of k runs), and the new run's own within-run error where that
        is larger than a typical run's."""
        center_var = (np.pi / 2) * self.scale**2 / self.k
        run_var = max(self.scale**2, new_se**2)
        return float(np.sqrt(run_var + center_var))

    def t_score(self, log_value: float, new_se: float = 0.0) -> float:
        return (log_value - self.center) / self.predictive_sigma(new_se)

    def p_slower(self, log_value: float, new_se: float = 0.0) -> float:
        """One-sided p-value that a run this slow comes from the baseline."""
        from scipy import stats  # here, not at import: scipy is most of a coordinator's start

        return float(stats.t.sf(self.t_score(log_value, new_se), df=max(self.k - 1, 2)))

    def effect(self, median_us: float) -> float:
        return float(median_us / self.median_us - 1.0)


def baseline(history: Sequence[RunPoint]) -> Baseline:
    """Robust center and run-to-run scale of the history's log medians."""
    if not history:
        raise ValueError("a baseline needs at least one run")
    logs = np.array([p.log_median for p in history])
    center = float(np.median(logs))
    mad_scale = MAD_TO_SIGMA * float(np.median(np.abs(logs - center)))
    within = float(np.median([p.median_se for p in history]))
    return Baseline(center=center, scale=max(mad_scale, within, SCALE_FLOOR), k=len(history))
