"""Where exactly a confirmed slowdown starts: the run pair that attribution and grouping name.

The online detector places a suspect before it has seen the runs after it, and the scan's split is
tested for significance, not placed for attribution. Once the runs on both sides are stored,
:func:`locate` re-places each alert by maximum likelihood over the runs between its neighbouring
alerts: for every candidate first slower run within ``radius`` of where the alert stands, the two
levels are the medians of the log medians on either side, and each run's distance from its level
is scored with the series' robust run-to-run sigma under a two-part noise model: normal wander,
plus a share ``bad_share`` of bad runs ``bad_width`` times as spread out, so one bad run next to
the change costs a few nats instead of pulling the split onto itself.

A small step's position is often genuinely ambiguous: one run of wander just before the step looks
like its first slower run. Regressions have causes, so a split at a run pair where something
recorded changed (an attribute of :data:`.base.ATTRIBUTES`: MLX version, OS, driver, kernel,
config, worker) gets ``change_bonus`` nats of prior log-odds: a split where nothing changed wins only
when the runs make it ``exp(change_bonus)`` times more likely. Where every run pair changed something
(or none did) the prior is flat and the likelihood alone decides. Where the detector placed the
alert gets ``stay_bonus`` nats, so a near tie does not move it. The level before an alert starts
after the latest improvement before it (as the online detector's baseline does): a regression soon
after an improvement is placed against the improved level, not a median of both. Tuned on the
detector benchmark's seed 101 (``benchmarks/detector.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernelfleet.service.regressions.base import ATTRIBUTES, RunPoint
from kernelfleet.service.regressions.segments import robust_sigma

RADIUS = 3  # runs an alert may move
CHANGE_BONUS = 3.0  # nats of prior log-odds for a split at a run pair where an attribute changed
STAY_BONUS = 1.0  # nats of prior log-odds for where the alert stands (the detector placed it there)
BAD_SHARE = 0.03  # share of runs that are bad (far off their level)
BAD_WIDTH = 5.0  # a bad run's spread, in run-to-run sigmas


def _loglik(x: np.ndarray, sigma: float) -> float:
    """Log-likelihood (up to a constant) of runs ``x`` around their median: normal wander with a
    share of bad runs."""
    z = (x - np.median(x)) / sigma
    normal = (1 - BAD_SHARE) * np.exp(-(z**2) / 2)
    bad = BAD_SHARE * np.exp(-((z / BAD_WIDTH) ** 2) / 2) / BAD_WIDTH
    return float(np.log(normal + bad).sum())


def locate(
    runs: Sequence[RunPoint],
    alerts: Sequence[int],
    radius: int = RADIUS,
    change_bonus: float = CHANGE_BONUS,
    stay_bonus: float = STAY_BONUS,
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
            ll = _loglik(before, sigma) + _loglik(after, sigma) + (change_bonus if changed[tau] else 0.0) + (
                stay_bonus if tau == t else 0.0
            )
            if ll > best_ll + 1e-12:
                best, best_ll = tau, ll
        out.append(best)
    return out
