"""Where exactly a confirmed slowdown starts: the run pair that attribution and grouping name.

The online detector places a suspect before it has seen the runs after it, and the scan's split is
tested for significance, not placed for attribution. Once the runs on both sides are stored,
:func:`locate` re-places each alert by maximum likelihood over the runs between its neighbouring
alerts: for every candidate first slower run within ``radius`` of where the alert stands, each run's
distance from its level is scored with the series' robust run-to-run sigma under a mixture:

- normal wander around the level;
- bad runs (a share ``BAD_SHARE``): slower than their level by any amount up to ``BAD_RANGE``,
  all alike. A bad run is a device's state (clocks, heat, other load), several percent or more
  whatever the series' own wander, so it is not scored in the series' sigmas: a +12 % bad run
  just before a 5 % step is as likely on the old level as on the new one, and the runs that are
  *not* bad decide where the step is (scored in sigmas, a bad run far above the old level would
  pull the split onto itself, one run early);
- other odd runs (a share ``ODD_SHARE``, either side) ``ODD_WIDTH`` times as spread out as wander.

Each level is the mean of its runs within ``LEVEL_TRIM`` sigmas of their median (a bad run or two
in a short level does not move its center off the ordinary runs).

A small step's position is often genuinely ambiguous: one run of wander just before the step looks
like its first slower run. Regressions have causes, so a split at a run pair where something
recorded changed (an attribute of :data:`.base.ATTRIBUTES`: MLX version, OS, driver, kernel,
config, worker) gets ``change_bonus`` nats of prior log-odds: a split where nothing changed wins only
when the runs make it ``exp(change_bonus)`` (about 150) times more likely. A bad run just before a
step often lands on the new level, and the runs alone then favour it as the step's start by a
factor of e^4-e^5; at 3 nats such alerts stood one run early (a miss and a false alarm at once), the
commonest false alert of the benchmark. Between two run pairs that both changed something the
bonus cancels; a slowdown with no recorded cause near a benign change is the case it can misplace.
Where every run pair changed something (or none did) the prior is flat and the likelihood alone
decides. Where the detector placed the
alert gets no bonus: it placed it from the same runs (the online detector from fewer of them, and
often at a bad run just before the step), so it is no evidence of its own. The level before an alert
starts after the latest improvement before it (as the online detector's baseline does): a
regression soon after an improvement is placed against the improved level, not a median of both.
Tuned on the detector benchmark's seeds 101-104 (``benchmarks/detector.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernelfleet.service.regressions.base import ATTRIBUTES, RunPoint
from kernelfleet.service.regressions.segments import robust_sigma

RADIUS = 3  # runs an alert may move
CHANGE_BONUS = 5.0  # nats of prior log-odds for a split at a run pair where an attribute changed
# (3.0 before; 4-5 on seeds 101-104 removed 19 of 68 false alerts, no more at 5 % prevalence beyond 5)
BAD_SHARE = 0.03  # share of runs that are bad: slower than their level ...
BAD_RANGE = 0.3  # ... by any amount up to this (log units, about 35 %)
ODD_SHARE = 0.03  # share of other odd runs, off their level either way ...
ODD_WIDTH = 5.0  # ... with this spread, in run-to-run sigmas
LEVEL_TRIM = 2.5  # a level is the mean of its runs within this many sigmas of their median


def _loglik(x: np.ndarray, sigma: float) -> float:
    """Log-likelihood (up to a constant) of runs ``x`` around their level: normal wander, bad runs
    (slower by any amount up to ``BAD_RANGE``) and other odd runs."""
    median = float(np.median(x))
    near = np.abs(x - median) <= LEVEL_TRIM * sigma
    d = x - (float(x[near].mean()) if near.any() else median)
    z = d / sigma
    normal = (1 - BAD_SHARE - ODD_SHARE) * np.exp(-(z**2) / 2)
    odd = ODD_SHARE * np.exp(-((z / ODD_WIDTH) ** 2) / 2) / ODD_WIDTH
    # densities in units of the normal one's 1 / (sqrt(2 pi) sigma): a bad run's is 1 / BAD_RANGE
    bad = np.where((d > 0) & (d <= BAD_RANGE), BAD_SHARE * np.sqrt(2 * np.pi) * sigma / BAD_RANGE, 0.0)
    # a run far off both (a huge spike on a quiet series) scores the same on either level
    return float(np.log(np.maximum(normal + odd + bad, np.finfo(float).tiny)).sum())


def locate(
    runs: Sequence[RunPoint],
    alerts: Sequence[int],
    radius: int = RADIUS,
    change_bonus: float = CHANGE_BONUS,
) -> list[int]:
    """The first slower run of each alert in ``alerts`` (indices into ``runs``, oldest first),
    each re-placed between its (re-placed) predecessor and its successor."""
    x = np.array([p.log_median for p in runs], dtype=float)
    sigma = robust_sigma(x)
    changed = [False] + [
        any(runs[i].attrs.get(a) != runs[i - 1].attrs.get(a) for a in ATTRIBUTES) for i in range(1, len(runs))
    ]
    order = sorted(alerts)
    out: list[int] = []
    from kernelfleet.service.regressions.step import StepDetector

    improved = StepDetector().since_improvement
    for k, t in enumerate(order):
        lo = out[-1] if out else 0
        lo += improved(runs[lo:t])  # the level before the change starts after an improvement
        hi = order[k + 1] if k + 1 < len(order) else len(x)
        best, best_ll = t, -np.inf
        for tau in range(max(lo + 1, t - radius), min(hi - 1, t + radius) + 1):
            before, after = x[lo:tau], x[tau:hi]
            if np.median(after) <= np.median(before):
                continue  # a slowdown stays a slowdown
            ll = _loglik(before, sigma) + _loglik(after, sigma) + (change_bonus if changed[tau] else 0.0)
            if ll > best_ll + 1e-12:
                best, best_ll = tau, ll
        out.append(best)
    return out
