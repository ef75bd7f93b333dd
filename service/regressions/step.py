"""The online step detector: did the series get slower in its last few runs?

Each new run is checked against the runs since the series' baseline started (at most the last
``window``), and since the latest improvement among them (a faster level restarts the baseline,
so a regression soon after an improvement is measured against the improved level).
The detector tries every split that puts the new run on the slower side and the change
at most ``lookback`` runs back, and tests the two levels with :func:`.segments.level_shift` (a
pooled run-to-run sigma with a prior, so two or three runs of history are enough, and medians, so
an earlier bad run or a step already a few runs old does not hide the change). Of the splits that
pass the gates below, the one whose two means differ most is taken (CUSUM: the medians would not
tell a high run just before a step from its first run). It is a suspect when:

- the levels differ by at least ``min_effect`` and every run on the slower side is at least
  ``floor * min_effect`` slower than the faster level (one bad run among normal ones is no step),
  and two slower runs lie within ``prior.pair_spread`` sigmas plus half the step of each other (a
  spike next to a bad run is no level);
- its p-value is below ``alpha``;
- the new run's raw samples are shifted against those of the ordinary runs just before the change
  (one-sided Mann-Whitney U below ``sample_alpha``), so one odd median cannot carry it alone; a
  bad run among them (slower than the baseline's median by the every-run floor) is left out of
  that reference, whose samples would be as slow as a step's.

The suspect names the first slower run (``Finding.index``), so attribution compares that run with
the one just before it. A suspect is not an alert: the coordinator queues a confirmation re-run,
and :meth:`StepDetector.confirms` tests the suspect's slower runs *and* the re-run together as
one level against the same faster level (joint effect and joint p-value below
``confirm_alpha``), with the same every-run floor, so a 5 % step whose re-run lands at +2.5 % is
still confirmed while a spike or a single bad run is not. Bad runs also come in pairs, so a joint
finding on two slower runs alone (the suspect and one re-run) is not :meth:`StepDetector.settled`
unless its effect is at least ``pair_ceiling``: the coordinator queues one more re-run, and so on
until ``settle_runs`` (4) slower runs are tested together (a spike next to a bad pair is three odd
runs in a row). Nor is one whose slower runs no longer make a step (``robust_alpha``)
once any one run or pair of consecutive runs among them is left out (:attr:`.base.Finding.robust`):
a bad pair must not lift an ordinary run of wander into a step, so the effect, not each run, has to
clear ``min_effect`` without it. Such a suspect gets more re-runs, and at ``settle_max`` slower runs
it is dismissed. So does a joint finding whose p-value is short of ``confirm_alpha`` but below
``pending_alpha`` (a small step on a few runs; its evidence grows with each re-run): it is returned
pending (:meth:`settled` says no) until ``settle_max`` slower runs, then dismissed unless it clears
``confirm_alpha``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kernelfleet.service.regressions.base import Finding, RunPoint, register_online
from kernelfleet.service.regressions.segments import (
    LevelShift,
    Prior,
    cusum_stat,
    level_shift,
    may_hold,
    slow_side_holds,
    without_bad_stretch,
)


@dataclass(frozen=True)
class StepDetector:
    name: str = "step"
    min_history: int = 2
    lookback: int = 4  # the change may be this many runs old (the newest run included)
    window: int = 14  # runs tested at once (at most window - lookback before the change): a slow
    # drift over a longer history is the scan's to find, not a step
    alpha: float = 1e-2
    sample_alpha: float = 1e-3
    sample_runs: int = 3
    confirm_alpha: float = 1.5e-3
    pending_alpha: float = 1e-2  # a joint p-value below this (not yet confirm_alpha) earns one more
    # re-run, up to settle_max slower runs: a small step's evidence grows with each re-run
    floor: float = 0.5  # every slower run is at least floor * min_effect above the faster level
    improvement: float = 0.05  # a faster level by this much restarts the baseline
    settle_runs: int = 4  # slower runs (the suspect's and its re-runs) a confirmed step rests on ...
    pair_ceiling: float = 0.20  # ... unless it is this large: bad runs come alone and in pairs
    robust_alpha: float = 1e-2  # the step without its worst bad run or pair (see _robust)
    bad_stretch: int = 2  # the longest stretch of consecutive bad runs left out (see _robust)
    settle_max: int = 5  # slower runs after which a step that a bad stretch could make is dismissed
    prior: Prior = field(default_factory=Prior)

    def check(self, history: Sequence[RunPoint], new: RunPoint, min_effect: float) -> Finding | None:
        if len(history) < self.min_history:
            return None
        skip = max(0, len(history) - (self.window - 1))
        skip += self._since_improvement(history[skip:])
        if len(history) - skip < self.min_history:
            return None
        runs = [*history[skip:], new]
        x = np.array([p.log_median for p in runs], dtype=float)
        stat = cusum_stat(x, 1)  # where the change is: the split whose means differ most
        best: LevelShift | None = None
        for tau in range(max(1, len(runs) - self.lookback), len(runs)):
            shift = self._shift(runs, x, tau, min_effect)
            if shift is not None and (best is None or stat[tau - 1] > stat[best.tau - 1]):
                best = shift
        if best is None or best.p_value >= self.alpha:
            return None
        if not self._samples_shifted(runs[: best.tau], new, min_effect):
            return None
        return self._finding(best, skip)

    def confirms(
        self, history: Sequence[RunPoint], suspect: Finding, rerun: RunPoint, min_effect: float
    ) -> Finding | None:
        """``history``: the runs since the baseline started up to the re-run (the suspect's slower
        runs from ``suspect.index`` on included); ``rerun``: the confirmation run. The joint
        finding when the slower runs and the re-run together clear ``confirm_alpha``, or, short of
        ``settle_max`` slower runs, ``pending_alpha`` (pending: not :meth:`settled`)."""
        if not 0 < suspect.index <= len(history):
            return None
        skip = max(0, suspect.index - (self.window - self.lookback))
        skip += self._since_improvement(history[skip : suspect.index])
        runs = [*history[skip:], rerun]
        x = np.array([p.log_median for p in runs], dtype=float)
        best = self._shift(runs, x, suspect.index - skip, min_effect)
        if best is None:
            return None
        last = len(runs) - best.tau >= self.settle_max  # as many re-runs as a step gets
        if best.p_value >= self.confirm_alpha and (best.p_value >= self.pending_alpha or last):
            return None
        robust = self._robust(runs, x, best.tau, min_effect)
        if not robust and last:
            return None  # and still a bad stretch could make it
        return replace(self._finding(best, skip), robust=robust)

    def _robust(self, runs: Sequence[RunPoint], x: np.ndarray, tau: int, min_effect: float) -> bool:
        """Whether the slower runs from ``tau`` on still make a step (``min_effect``, every-run
        floor, ``robust_alpha``) with any bad run or bad pair among them left out."""
        for rest, y in without_bad_stretch(runs, x, tau, self.bad_stretch):
            shift = self._shift(rest, y, tau, min_effect)
            if shift is None or shift.p_value >= self.robust_alpha:
                return False
        return True

    def shift_at(self, runs: Sequence[RunPoint], tau: int, min_effect: float) -> Finding | None:
        """The test :meth:`check` makes of one split, at ``tau``, with its gates: ``min_history``
        runs before it, the every-run floor, ``alpha``."""
        if not self.min_history <= tau < len(runs):
            return None
        best = self._shift(runs, np.array([p.log_median for p in runs], dtype=float), tau, min_effect)
        return None if best is None or best.p_value >= self.alpha else self._finding(best, 0)

    def settled(self, joint: Finding, runs: int) -> bool:
        """Whether a joint finding on ``runs`` runs (index of the first slower run to the newest,
        the re-run included) is enough to alert: at least ``settle_runs`` slower runs, or an effect
        of ``pair_ceiling`` or more, and the step holds without any one bad run or bad pair among
        them (:attr:`.base.Finding.robust`), and its p-value clears ``confirm_alpha`` (a pending
        finding waits for more re-runs). Bad runs come alone and in pairs (a device's state
        lasts a run or two), and a spike may land next to a pair, so two or three slower runs of a
        modest effect are what odd runs look like; the coordinator asks for one more re-run
        instead."""
        if joint.p_value >= self.confirm_alpha:
            return False  # pending: the joint evidence is not yet strong enough (see confirms)
        return (runs >= self.settle_runs and joint.robust) or joint.effect >= self.pair_ceiling

    def since_improvement(self, history: Sequence[RunPoint]) -> int:
        """Where the baseline starts in ``history`` (see :meth:`_since_improvement`)."""
        return self._since_improvement(history)

    def _since_improvement(self, history: Sequence[RunPoint]) -> int:
        """Where the baseline starts in ``history``: after the latest improvement (a faster level
        of at least ``min_history`` runs, by the same test and gates as a slowdown at ``alpha``; of
        several, the split whose means differ most), else 0. The runs before an improvement are
        no longer the series' normal: against their median, a regression back to that level would
        look like none."""
        n = len(history)
        if n < 2 * self.min_history:
            return 0
        x = -np.array([p.log_median for p in history], dtype=float)  # a slowdown of -x is an improvement
        stat = cusum_stat(x, 1)
        best = 0
        floor = self.floor * self.improvement
        for tau in range(self.min_history, n - self.min_history + 1):
            if not may_hold(x, tau, floor):
                continue
            shift = level_shift(history, tau, self.prior, x)
            if (shift.effect >= self.improvement and shift.p_value < self.alpha
                    and slow_side_holds(x, shift, floor, self.prior.pair_spread, self.prior.level_sigmas)
                    and (not best or stat[tau - 1] > stat[best - 1])):
                best = tau  # where the change is, by the means (as for a slowdown)
        return best

    def _shift(
        self, runs: Sequence[RunPoint], x: np.ndarray, tau: int, min_effect: float
    ) -> LevelShift | None:
        floor = self.floor * min_effect
        if not may_hold(x, tau, floor):
            return None
        shift = level_shift(runs, tau, self.prior, x)
        holds = slow_side_holds(x, shift, floor, self.prior.pair_spread, self.prior.level_sigmas)
        if shift.effect < min_effect or not holds:
            return None
        return shift

    def _finding(self, shift: LevelShift, skip: int) -> Finding:
        """The finding of ``shift`` in runs from which the first ``skip`` were left out."""
        return Finding(
            detector=self.name,
            index=skip + shift.tau,
            baseline_median_us=float(np.exp(shift.before)),
            new_median_us=float(np.exp(shift.after)),
            effect=shift.effect,
            p_value=shift.p_value,
            baseline_indices=tuple(range(skip, skip + shift.tau)),
        )

    def _samples_shifted(self, before: Sequence[RunPoint], new: RunPoint, min_effect: float) -> bool:
        """Whether ``new``'s raw samples are shifted against those of the last ``sample_runs``
        ordinary runs of ``before``: a run slower than their median by the every-run floor (a bad
        run, whose samples are all slow) is no reference for the baseline's samples."""
        x = np.array([p.log_median for p in before], dtype=float)
        ordinary = x <= np.median(x) + np.log1p(self.floor * min_effect)
        reference = [p for p, keep in zip(before, ordinary, strict=True) if keep]
        recent = [p.samples_us for p in reference[-self.sample_runs :] if p.samples_us]
        if not new.samples_us or not recent:
            return True  # capped samples: the run-level test stands alone
        pooled = np.concatenate([np.asarray(s, dtype=float) for s in recent])
        from scipy import stats  # here, not at import: scipy is most of a coordinator's start

        test = stats.mannwhitneyu(np.asarray(new.samples_us, dtype=float), pooled, alternative="greater")
        return bool(test.pvalue < self.sample_alpha)


register_online(StepDetector())
