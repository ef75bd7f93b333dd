"""The online step detector: is the new run slower than the series' recent history?

A new run is *suspect* when all of these hold:
- its median is slower than the history's robust center by at least ``min_effect``;
- the run-level test (:mod:`.noise`: run-to-run variance of the history's medians, the new run's
  own within-run error, t tails) puts it below ``alpha``;
- its raw samples are shifted against the raw samples of the most recent history runs
  (one-sided Mann-Whitney U below ``sample_alpha``), so one odd median cannot carry it alone.

A suspect is not an alert: the coordinator queues a confirmation re-run on the same chip, and the
regression opens only when :meth:`StepDetector.confirms` accepts that re-run (at least
``confirm_fraction`` of the suspect's effect, and beyond the noise at ``confirm_alpha``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from kernelfleet.service.regressions.base import Finding, RunPoint, register_online
from kernelfleet.service.regressions.noise import baseline


@dataclass(frozen=True)
class StepDetector:
    name: str = "step"
    min_history: int = 5
    alpha: float = 1e-3
    sample_alpha: float = 1e-3
    sample_runs: int = 3
    confirm_alpha: float = 1e-2
    confirm_fraction: float = 0.5

    def check(self, history: Sequence[RunPoint], new: RunPoint, min_effect: float) -> Finding | None:
        if len(history) < self.min_history:
            return None
        base = baseline(history)
        effect = base.effect(new.median_us)
        if effect < min_effect:
            return None
        p = base.p_slower(new.log_median, new.median_se)
        if p >= self.alpha:
            return None
        if not self._samples_shifted(history, new):
            return None
        return Finding(
            detector=self.name,
            index=len(history),
            baseline_median_us=base.median_us,
            new_median_us=new.median_us,
            effect=effect,
            p_value=p,
            baseline_indices=tuple(range(len(history))),
        )

    def confirms(
        self, history: Sequence[RunPoint], suspect: Finding, rerun: RunPoint, min_effect: float
    ) -> bool:
        if not history:
            return False
        base = baseline(history)
        effect = base.effect(rerun.median_us)
        if effect < max(min_effect, self.confirm_fraction * suspect.effect):
            return False
        return base.p_slower(rerun.log_median, rerun.median_se) < self.confirm_alpha

    def _samples_shifted(self, history: Sequence[RunPoint], new: RunPoint) -> bool:
        recent = [p.samples_us for p in history[-self.sample_runs :] if p.samples_us]
        if not new.samples_us or not recent:
            return True  # capped samples: the run-level test stands alone
        pooled = np.concatenate([np.asarray(s, dtype=float) for s in recent])
        test = stats.mannwhitneyu(np.asarray(new.samples_us, dtype=float), pooled, alternative="greater")
        return bool(test.pvalue < self.sample_alpha)


register_online(StepDetector())
