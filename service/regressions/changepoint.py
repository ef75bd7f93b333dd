"""The offline change-point pass: binary segmentation of a series' per-run log medians.

Gradual drift never shows as one step against the recent history, but it does split the series
into an earlier and a later level. The pass:

1. tames outlier runs: each log median is clipped to its rolling median (5 runs) minus
   ``clip_sigmas`` and plus ``clip_up`` robust sigmas (the sigma comes from first differences,
   which a level shift hardly moves), so a single bad run cannot make a change point. Bad runs are
   only slower, so the band above is the narrower: a bad run next to a step (where its rolling
   median is still the old level) or in the baseline would otherwise pull the means of the split
   below towards itself, costing a small step its significance or moving its cut;
2. finds the split maximizing the normalized difference of means (a CUSUM statistic);
3. accepts it when a permutation test (the segment's runs shuffled ``permutations`` times) gives
   p below ``p_threshold`` *and* the medians on both sides differ by at least ``min_effect``;
4. recurses into both sides (binary segmentation), with at least ``min_segment`` runs per side;
5. moves each cut by up to ``refine_runs`` runs to where the CUSUM statistic between its
   neighbouring cuts is largest (the split in 2. cannot cut closer than
   ``min_segment`` runs to an end, so a step at the third-last run is first cut a run early);
6. looks for a change near either end, which the split above cannot reach (it needs ``min_segment``
   runs on each side): in the first segment, a faster level of 1 to ``edge_runs`` runs; in the last,
   a slower level of ``edge_tail`` (4) to ``edge_runs`` runs (up to three runs at the end may be
   a bad run, a bad pair, or a spike next to a pair: the online detector's suspect, settled by its
   confirmation re-runs, which settle a step under ``pair_ceiling`` on four slower runs too).
   These use :func:`.segments.level_shift` (trimmed means of the levels: ``prior.trim``) with the
   stricter ``edge_alpha``, and every run of the
   short side must clear the other level's median by ``floor * min_effect``, so a bad run or two
   next to the end cannot make a step;
7. merges consecutive slower splits less than ``merge_within`` runs apart (a ramp is cut into
   several steps) into one finding, from the level before the first to the level after the last.

Findings whose level rose by at least ``min_effect`` are reported, those whose slower level is
shorter than ``edge_tail`` runs (three odd runs in a row: a spike next to a bad pair) only from
``pair_ceiling`` (20 %) on, and
below that only when the slower level still clears ``min_effect`` at ``robust_alpha`` with any one
of its runs or pair of consecutive runs left out (bad runs come alone and in pairs: near the end of
a series, a bad pair next to an ordinary run of wander has the median of a step).
The permutation generator is seeded, so a scan of the same data gives the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kernelfleet.service.regressions.base import Finding, RunPoint, register_offline
from kernelfleet.service.regressions.segments import (
    LevelShift,
    Prior,
    cusum_stat,
    fast_side_holds,
    level_shift,
    slow_side_holds,
    tame,
    without_bad_stretch,
)


@dataclass(frozen=True)
class ChangePointDetector:
    name: str = "changepoint"
    min_segment: int = 5
    permutations: int = 999
    p_threshold: float = 0.01
    clip_sigmas: float = 3.0
    clip_up: float = 1.0  # a run counts at most this many robust sigmas above its rolling median
    # (bad runs are only slower; see segments.tame)
    seed: int = 20261126
    merge_within: int = 15  # runs: slower steps closer than this are one (gradual) change
    refine_runs: int = 2  # a cut may move this far to where the change is clearest
    edge_runs: int = 4  # a change this close to either end is looked for by the edge test
    edge_alpha: float = 3e-3
    pair_ceiling: float = 0.20  # a slower level shorter than edge_tail is reported from this effect on
    edge_tail: int = 4  # the shortest slower level at the end (bad runs come alone and in pairs,
    # and a spike may land next to a pair: a step in the last three runs is the online detector's,
    # which settles one under pair_ceiling on four slower runs: StepDetector.settle_runs)
    floor: float = 0.5
    robust_alpha: float = 1e-2  # a finding without its worst bad run or pair (see _robust)
    # the scan sees whole levels of many runs: trimmed means, not medians (see segments._trimmed_level)
    prior: Prior = field(default_factory=lambda: Prior(trim=2.5))

    def scan(self, runs: Sequence[RunPoint], min_effect: float) -> list[Finding]:
        raw = np.array([p.log_median for p in runs], dtype=float)
        if len(raw) < 3:
            return []
        x = tame(raw, self.clip_sigmas, self.clip_up) if len(raw) >= 2 * self.min_segment else raw
        rng = np.random.default_rng(self.seed)
        cuts: list[tuple[int, float]] = []
        stack = [(0, len(x))]
        while stack:
            a, b = stack.pop()
            split = self._best_split(x[a:b], raw[a:b], rng, min_effect)
            if split is None:
                continue
            cuts.append((a + split[0], split[1]))
            stack.extend([(a, a + split[0]), (a + split[0], b)])
        cuts = self._refine(x, sorted(cuts))
        first_end = cuts[0][0] if cuts else len(raw)
        last_start = cuts[-1][0] if cuts else 0
        for a, b, head in ((0, first_end, True), (last_start, len(raw), False)):
            edge = self._edge_split(runs[a:b], raw[a:b], head, min_effect)
            if edge is not None and all(abs(c - (a + edge.tau)) > self.refine_runs for c, _ in cuts):
                cuts.append((a + edge.tau, edge.p_value))
        return self._findings(runs, raw, sorted(cuts), min_effect)

    def _refine(self, x: np.ndarray, cuts: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """Each cut moved (by at most ``refine_runs``, between its neighbours) to where the difference
        of the (tamed) levels between its neighbouring cuts is largest: the split above cannot cut
        closer than ``min_segment`` runs to an end, so a change at the third-last run is first cut a
        run early."""
        out: list[tuple[int, float]] = []
        for i, (cut, p) in enumerate(cuts):
            a = out[-1][0] if out else 0
            b = cuts[i + 1][0] if i + 1 < len(cuts) else len(x)
            taus = range(max(a + 1, cut - self.refine_runs), min(b - 1, cut + self.refine_runs) + 1)
            if len(taus) > 1:
                stat = cusum_stat(x[a:b], 1)  # one value per split a+1 .. b-1
                cut = max(taus, key=lambda t: stat[t - a - 1])
            out.append((cut, p))
        return out

    def _edge_split(
        self, runs: Sequence[RunPoint], x: np.ndarray, head: bool, min_effect: float
    ) -> LevelShift | None:
        """The most significant slowdown with a short faster side at the head of ``runs``
        (``head``) or a short slower side at its tail."""
        m = len(x)
        tail = range(max(1, m - self.edge_runs), m - self.edge_tail + 1)
        taus = range(1, min(self.edge_runs, m - 2) + 1) if head else tail
        stat = cusum_stat(x, 1)
        best: LevelShift | None = None
        for tau in taus:
            shift = level_shift(runs, tau, self.prior, x)
            floor = self.floor * min_effect
            if head:
                holds = fast_side_holds(x, shift, floor)
            else:
                holds = slow_side_holds(x, shift, floor, self.prior.pair_spread, self.prior.level_sigmas)
            if shift.effect < min_effect or not holds:
                continue
            if best is None or stat[tau - 1] > stat[best.tau - 1]:  # where the change is, by the means
                best = shift
        return best if best is not None and best.p_value < self.edge_alpha else None

    def _findings(
        self, runs: Sequence[RunPoint], raw: np.ndarray, cuts: list[tuple[int, float]], min_effect: float
    ) -> list[Finding]:
        """One finding per slowdown: consecutive slower cuts with short segments between them (a ramp
        cut into steps) merge into one, from the segment before the first to the one after the last."""
        bounds = [0] + [c for c, _ in cuts] + [len(raw)]
        medians = [float(np.median(raw[bounds[i] : bounds[i + 1]])) for i in range(len(bounds) - 1)]
        findings: list[Finding] = []
        i = 0
        while i < len(cuts):
            if medians[i + 1] <= medians[i]:
                i += 1
                continue
            j = i
            while (
                j + 1 < len(cuts)
                and medians[j + 2] > medians[j + 1]
                and bounds[j + 2] - bounds[j + 1] < self.merge_within
            ):
                j += 1
            before, after = medians[i], medians[j + 1]
            effect = float(np.exp(after - before) - 1.0)
            short = bounds[j + 2] - bounds[j + 1] < self.edge_tail  # as long as a bad pair
            a, b, c = bounds[i], bounds[i + 1], bounds[j + 2]
            if effect >= min_effect and (effect >= self.pair_ceiling or (
                    not short and self._robust(runs[a:c], raw[a:c], b - a, min_effect))):
                findings.append(
                    Finding(
                        detector=self.name,
                        index=cuts[i][0],
                        baseline_median_us=float(np.exp(before)),
                        new_median_us=float(np.exp(after)),
                        effect=effect,
                        p_value=max(p for _, p in cuts[i : j + 1]),
                        baseline_indices=tuple(range(bounds[i], bounds[i + 1])),
                    )
                )
            i = j + 1
        return findings

    def _robust(self, runs: Sequence[RunPoint], x: np.ndarray, tau: int, min_effect: float) -> bool:
        """Whether the level from ``tau`` on is still slower than the one before it by
        ``min_effect`` (``robust_alpha``) with any bad run or bad pair among its runs left out:
        bad runs come alone and in pairs, so near the end of a series a pair next to an ordinary
        run of wander is no step."""
        for rest, y in without_bad_stretch(runs, x, tau):
            shift = level_shift(rest, tau, self.prior, y)
            if shift.effect < min_effect or shift.p_value >= self.robust_alpha:
                return False
        return True

    def _best_split(
        self, x: np.ndarray, raw: np.ndarray, rng: np.random.Generator, min_effect: float
    ) -> tuple[int, float] | None:
        m = len(x)
        if m < 2 * self.min_segment:
            return None
        observed = cusum_stat(x, self.min_segment)
        tau = int(np.argmax(observed)) + self.min_segment
        effect = float(np.exp(np.median(raw[tau:]) - np.median(raw[:tau])) - 1.0)
        if abs(effect) < min_effect:
            return None
        shuffled = rng.permuted(np.broadcast_to(x, (self.permutations, m)), axis=1)
        null_max = cusum_stat(shuffled, self.min_segment).max(axis=1)
        p = float((1 + np.count_nonzero(null_max >= observed.max())) / (self.permutations + 1))
        if p >= self.p_threshold:
            return None
        return tau, p


register_offline(ChangePointDetector())
