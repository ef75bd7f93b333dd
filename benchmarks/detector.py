"""Regression detector benchmark: KernelFleet's detector on labelled synthetic series, at a realistic
prevalence (5 % of series carry a change) and at 68 % (labelled), against apache-otava when installed.

Run it in an environment with the ``bench`` extra for the peer (apache-otava pins numpy 2.2 and
scipy 1.16, so give it its own venv), or with ``--no-peer``::

    python -m venv .venv-bench && .venv-bench/bin/pip install -e '.[bench]'
    .venv-bench/bin/python benchmarks/detector.py            # writes benchmarks/results/detector.txt

The data (seeded, so every run sees the same series): short series of 15 runs, as a chip's history
is when a kernel or shape is new, so that changes near either end are as common as in the middle.

- each series is one (kernel, shape, dtype, chip); each run has 50 raw samples; the noise has three
  layers: within-run spread (lognormal, 1-5 %, plus 5 % heavy-tail samples), run-to-run wander of
  the run's center (0.5-2 %) and bad runs: 3 % of runs start a bad stretch, +5-15 % a run, that is
  one run alone or (35 % of them) a pair;
- labelled positives: steps of 3, 5, 10 and 20 % at every position (the first slower run is run
  2 to 15, so runs 2-4 are "early", 5-12 "middle", 13-15 "late"); drifts of 10 and 20 % over 4-8
  runs; a 15 % slowdown 4-6 runs after an improvement of 10-20 %; multi-chip events: an MLX upgrade
  reaches 4 chips at the same run and slows 2 of them by 10 %, in series where *every* run has a
  different MLX version (so only the exact pair of runs around the change names the right upgrade),
  and in half the events the OS updated at the same run on one slowed and one unaffected chip;
- labelled negatives: plain noise; single-run spikes (half +10-15 %, as large as a bad run, half
  +15-100 %); improvements (5-20 % faster); the chips that got the multi-chip upgrade without
  slowing down; benign OS updates at random.

Our detector runs as the coordinator runs it: the online step detector on every new run against
the runs since its baseline started (at most the last ``history``); a suspect waits for its
confirmation re-run, for which the next run stands in (past the newest run, a fresh draw at the same
true level, bad as often as any run, from a generator of the series' own, seeded by the seed, the
corpus and the series' index, so that no series' re-runs depend on how many another drew); when
the joint finding rests on two slower runs of a modest effect (:meth:`StepDetector.settled`) one
more re-run is taken, as the coordinator queues one more confirm job; a confirmed alert restarts
the baseline at its first slower run; then the offline scan over the whole series adds what no
alert covers and re-places every alert where its change most likely is
(:func:`kernelfleet.service.regressions.locate.locate`, as the coordinator's scan does).
The peer, apache-otava (Hunter's E-divisive means with a t-test merge step), sees the per-run
medians of the whole series, as it does in CI; both use the same 3 % minimum effect.

Scoring: an alert at run ``t`` is a true positive when the series has a labelled change at ``c``
and ``c <= t <= c + 3`` (the end of the ramp + 3 for drifts), at most one per change; every other
alert is false. Comparisons: one per run that has at least 2 earlier runs (the same denominator for
every method). Suspects: online suspects per comparison; re-runs: the confirmation jobs they cost.
Attribution is exact when the alert's run is the first slower run ``c`` and its cause names the
injected attribute's values of runs ``c - 1`` and ``c``; a multi-chip event is grouped when every
chip that alerted on it got the same group key. Recall and attribution pool the positives of both
corpora (a series is judged on its own, so recall does not depend on the prevalence).

Seeds: each seed gives both corpora and the re-runs; with several seeds (``--seeds``) every table
prints the figures pooled over the seeds (true and false alerts, comparisons and positives summed,
then the ratios) and a row per seed. The detector's thresholds were tuned on ``--seed 101``, its
alerts' re-placement (:mod:`kernelfleet.service.regressions.locate`) on seeds 101-104; the
committed results use the default, seeds 7, 11, 13 and 17, held out from that tuning (named as the
evaluation set before these figures were computed; 7 and 11 were quoted in earlier commits). With
about 104 positives of each step size a seed, one seed cannot tell 0.74 from 0.76.

Pooled over the four held-out seeds (``--no-peer``): at 5 % prevalence precision 0.912 and 0.33
false alerts per 1000 comparisons (68 %: 0.982, 0.82); 5 % steps found 0.764 (318 of 416; early /
middle / late 0.655 / 0.870 / 0.616), steps of 10 % or more 0.970 / 0.979 / 0.956, the exact run
pair 0.992 of caught steps. Each seed's own figures are in the report (5 % steps 0.750-0.798). The
scan's taming and its shortest slower level at the end, and the suspect test's sample reference,
were measured on seeds 101-104.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernelfleet.service.regressions.attribution import attribute, group_key
from kernelfleet.service.regressions.base import RunPoint, relocates, same_change
from kernelfleet.service.regressions.changepoint import ChangePointDetector
from kernelfleet.service.regressions.locate import locate
from kernelfleet.service.regressions.step import StepDetector

N_RUNS = 15
SAMPLES = 50
HISTORY = 20  # settings.regression_history_runs
MIN_EFFECT = 0.03  # settings.regression_min_effect
MIN_HISTORY = 2  # comparisons: runs with at least this many earlier runs
TRUE_AFTER = 3  # an alert is true at the first slower run c .. c + 3 (drift: end of ramp + 3)
EXTEND_RUNS = 6  # engine.EXTEND_RUNS: a slowdown this soon after an alert extends it
EARLY, LATE = range(1, 4), range(N_RUNS - 3, N_RUNS)  # 0-based index of the first slower run
BAD_RUN = 0.03  # share of runs that start a bad stretch (a bad run alone, or a pair)
BAD_PAIR = 0.35  # share of bad stretches that are two runs long
OUT = Path(__file__).parent / "results" / "detector.txt"
SEEDS = (7, 11, 13, 17)  # held out: the thresholds were tuned on seed 101, the re-placement on 101-104
POSITIVE = ("step", "drift", "rebound", "multichip+")


@dataclass
class Series:
    kind: str  # null | step | drift | rebound | spike | improvement | multichip+ | multichip-
    effect: float  # injected relative slowdown (0 for negatives)
    change: int | None  # first run at the new level (None for negatives)
    window_end: int  # last run at which an alert still counts as catching the change
    levels: np.ndarray  # true center of each run, in microseconds
    sigma_run: float
    sigma_within: float
    attrs: list[dict[str, str | None]]
    cause_attr: str | None
    group: int | None = None
    runs: list[RunPoint] = field(default_factory=list)
    bad: np.ndarray = field(default_factory=lambda: np.ones(N_RUNS))  # slowdown factor of bad runs


def bad_runs(rng: np.random.Generator) -> np.ndarray:
    """Each run's bad-run factor: 1, or +5-15 % for a bad run; bad runs come alone or in pairs."""
    factor = np.ones(N_RUNS)
    t = 0
    while t < N_RUNS:
        if rng.random() < BAD_RUN:
            width = 2 if rng.random() < BAD_PAIR else 1
            factor[t : t + width] = rng.uniform(1.05, 1.15, len(factor[t : t + width]))
            t += width + 1
        else:
            t += 1
    return factor


def draw_run(
    rng: np.random.Generator, s: Series, t: int, *, spike: float = 1.0, bad: float = 1.0
) -> RunPoint:
    """One run at time ``t``: run-to-run offset, a bad run's factor, 50 lognormal samples with a tail."""
    center = s.levels[t] * np.exp(rng.normal(0.0, s.sigma_run)) * spike * bad
    samples = center * np.exp(rng.normal(0.0, s.sigma_within, SAMPLES))
    tail = rng.random(SAMPLES) < 0.05
    samples[tail] *= rng.uniform(1.2, 3.0, int(tail.sum()))
    return RunPoint(
        median_us=float(np.median(samples)),
        samples_us=tuple(float(v) for v in samples),
        n=SAMPLES,
        attrs=s.attrs[t],
    )


def fresh_bad(rng: np.random.Generator) -> float:
    """A re-run's bad-run factor (re-runs are as often bad as any run)."""
    return float(rng.uniform(1.05, 1.15)) if rng.random() < BAD_RUN else 1.0


def make_attrs(
    rng: np.random.Generator,
    change: int | None,
    cause: str | None,
    versions: list[str] | None = None,
    os_with_change: bool = False,
) -> list[dict[str, str | None]]:
    base: dict[str, str | None] = {
        "mlx_version": "0.32.3",
        "os": "macOS 15.1",
        "driver": None,
        "kernel_hash": "k1",
        "config_key": "tg=256,vec=4",
        "worker": "w1",
    }
    attrs = [dict(base) for _ in range(N_RUNS)]
    if versions is not None:  # every run has its own MLX version
        for a, v in zip(attrs, versions, strict=True):
            a["mlx_version"] = v
    if os_with_change and change is not None:  # the OS updated at the same run as the MLX upgrade
        for a in attrs[change:]:
            a["os"] = "macOS 15.2"
    elif rng.random() < 0.3:  # a benign OS update somewhere
        for a in attrs[int(rng.integers(1, N_RUNS)) :]:
            a["os"] = "macOS 15.2"
    if change is not None and cause is not None and versions is None:
        new = {"mlx_version": "0.32.4", "kernel_hash": "k2", "driver": "d2", "os": "macOS 16.0"}[cause]
        for a in attrs[change:]:
            a[cause] = new
    return attrs


def make_series(
    rng: np.random.Generator,
    kind: str,
    effect: float,
    *,
    ramp: int = 0,
    change: int | None = None,
    cause: str | None = None,
    group: int | None = None,
    versions: list[str] | None = None,
    os_with_change: bool = False,
) -> Series:
    base = float(np.exp(rng.uniform(np.log(10), np.log(5000))))
    levels = np.full(N_RUNS, base)
    positive = kind in POSITIVE
    if kind == "rebound":  # an improvement of 10-20 % at a, then this slowdown 4-6 runs later
        a = int(rng.integers(3, N_RUNS - 7))
        change = a + int(rng.integers(4, 7))
        levels[a:] *= 1.0 - float(rng.uniform(0.10, 0.20))
        levels[change:] *= 1.0 + effect
    elif change is None and kind != "null":
        change = int(rng.integers(1, N_RUNS - max(ramp - 1, 0)))
    if kind in ("step", "drift", "multichip+", "improvement") and change is not None:
        ramp_frac = np.clip((np.arange(N_RUNS) - change + 1) / max(ramp, 1), 0.0, 1.0)
        levels = base * (1.0 + effect * ramp_frac)
    if cause is None and kind in ("step", "drift", "rebound"):
        cause = str(rng.choice(["mlx_version", "kernel_hash", "driver", "os"]))
    attrs = make_attrs(rng, change if positive else None, cause if positive else None, versions,
                       os_with_change)
    s = Series(
        kind=kind,
        effect=effect if positive else 0.0,
        change=change if positive else None,
        window_end=(change or 0) + max(ramp - 1, 0) + TRUE_AFTER,
        levels=levels,
        sigma_run=rng.uniform(0.005, 0.02),
        sigma_within=rng.uniform(0.01, 0.05),
        attrs=attrs,
        cause_attr=cause if positive else None,
        group=group,
        bad=bad_runs(rng),
    )
    spike_at = change if kind == "spike" else None
    # spikes: half of them +10-15 % (as large as a bad run), half +15-100 %
    spike = float(rng.uniform(1.10, 1.15) if rng.random() < 0.5 else rng.uniform(1.15, 2.0))
    s.runs = [
        draw_run(rng, s, t, spike=spike if t == spike_at else 1.0, bad=float(s.bad[t])) for t in range(N_RUNS)
    ]
    return s


STEPS = (0.03, 0.05, 0.05, 0.10, 0.10, 0.20)  # single-chip step sizes, in turn (5 and 10 % twice)


def build_corpus(seed: int, n_series: int, prevalence: float) -> list[Series]:
    """``n_series`` series of which a share ``prevalence`` carry a labelled slowdown: a fifth of the
    positives are multi-chip MLX upgrades (4 chips, 2 slowed, the OS updated at the same run on one
    slowed and one unaffected chip in half the events), the rest steps (3, 5, 10, 20 %), drifts (10,
    20 % over 4-8 runs) and rebounds (a slowdown 4-6 runs after an improvement). The negatives:
    plain noise (60 %), single-run spikes (20 %) and improvements (20 %), besides the unaffected
    chips of the multi-chip events. Every series has bad runs (+5-15 %, alone or in pairs)."""
    rng = np.random.default_rng(seed)
    n_pos = round(prevalence * n_series)
    events = n_pos // 10
    corpus: list[Series] = []
    for g in range(events):  # one MLX upgrade reaches 4 chips at once and slows down 2 of them
        change = int(rng.integers(1, N_RUNS))
        first = int(rng.integers(20, 80))
        versions = [f"0.{first + t}.0" for t in range(N_RUNS)]
        with_os = rng.random() < 0.5
        for chip in range(4):
            kind = "multichip+" if chip < 2 else "multichip-"
            corpus.append(make_series(rng, kind, 0.10, change=change, cause="mlx_version", group=g,
                                      versions=versions, os_with_change=with_os and chip % 2 == 0))
    singles = [("step", e, 0) for e in STEPS] + [("drift", 0.10, 1), ("drift", 0.20, 1), ("rebound", 0.15, 0)]
    for i in range(n_pos - 2 * events):
        kind, effect, drift = singles[i % len(singles)]
        ramp = int(rng.integers(4, 9)) if drift else 0
        corpus.append(make_series(rng, kind, effect, ramp=ramp))
    negatives = n_series - n_pos - 2 * events
    for i in range(negatives):
        kind = "null" if i % 5 < 3 else "spike" if i % 5 == 3 else "improvement"
        effect = -float(rng.uniform(0.05, 0.2)) if kind == "improvement" else 0.0
        corpus.append(make_series(rng, kind, effect))
    return corpus


# ---- methods: each returns the alert indices for one series ------------------------------------


@dataclass
class Outcome:
    alerts: list[int]
    suspects: int = 0
    jobs: int = 0  # confirmation re-runs
    causes: dict[int, dict[str, list[str | None]]] = field(default_factory=dict)
    levels: dict[int, tuple[float, float]] = field(default_factory=dict)  # (baseline, new) medians
    origin: dict[int, str] = field(default_factory=dict)  # alert -> "online" | "scan" (--false-alerts)


def pair_cause(s: Series, t: int) -> dict[str, list[str | None]]:
    """What the coordinator records for a change first seen at run ``t``: runs ``t - 1`` -> ``t``."""
    return attribute(s.runs[t - 1], s.runs[t])


def ours_online(s: Series, rng: np.random.Generator) -> Outcome:
    det = StepDetector()
    out = Outcome(alerts=[])
    start = 0
    t = 0
    while t < N_RUNS:
        first = max(start, t - HISTORY)
        history = s.runs[first:t]
        finding = det.check(history, s.runs[t], MIN_EFFECT)
        if finding is None:
            t += 1
            continue
        out.suspects += 1
        # the next runs stand in for the confirmation re-runs; past the newest run the suspect waits
        # for re-runs of its own (fresh draws at the same true level); one more re-run while the
        # joint finding is not settled (two slower runs of a modest effect: maybe a bad pair)
        seen = [*history, s.runs[t]]
        t += 1
        while True:
            out.jobs += 1
            rerun = s.runs[t] if t < N_RUNS else draw_run(rng, s, N_RUNS - 1, bad=fresh_bad(rng))
            t += 1
            joint = det.confirms(seen, finding, rerun, MIN_EFFECT)
            if joint is None or det.settled(joint, len(seen) - finding.index + 1):
                break
            seen.append(rerun)
        if joint is not None:
            index = first + finding.index
            if out.alerts and index - out.alerts[-1] <= EXTEND_RUNS:
                # the slowdown goes on (a ramp): the earlier alert's new level moves, no second alert
                last = out.alerts[-1]
                out.levels[last] = (out.levels[last][0], joint.new_median_us)
            else:
                out.alerts.append(index)
                out.causes[index] = pair_cause(s, index)
                out.levels[index] = (joint.baseline_median_us, joint.new_median_us)
                out.origin[index] = f"online (suspect at {index}, {joint.effect:+.1%})"
            start = index  # the new level is the baseline from here on
    return out


def rerun_rng(seed: int, table: int, index: int) -> np.random.Generator:
    """The generator of series ``index``'s confirmation re-runs past its newest run, in corpus
    ``table`` (0: 5 % prevalence, 1: 68 %) of ``seed``: its own, so that one series' re-runs never
    depend on how many re-runs another series drew."""
    return np.random.default_rng([seed, 1, table, index])


def ours(seed: int, table: int) -> Callable[[int, Series], Outcome]:
    """Our detector as a method: series ``i`` draws its re-runs from :func:`rerun_rng`."""
    return lambda i, s: ours_combined(s, rerun_rng(seed, table, i))


def ours_combined(s: Series, rng: np.random.Generator) -> Outcome:
    out = ours_online(s, rng)
    online = list(out.alerts)
    medians = [p.median_us for p in s.runs]
    for f in ChangePointDetector().scan(s.runs, MIN_EFFECT):
        levels = (f.baseline_median_us, f.new_median_us)
        same = [t for t in online if same_change(t, out.levels[t], f.index, levels, medians, MIN_EFFECT)]
        if not same:
            out.alerts.append(f.index)
            out.causes[f.index] = pair_cause(s, f.index)
            out.origin[f.index] = f"scan ({f.effect:+.1%}, p {f.p_value:.4f})"
        elif relocates(same[0], f, MIN_EFFECT) and f.index not in out.alerts:
            # the scan, with runs on both sides of the change, moves the alert to its run pair
            out.alerts[out.alerts.index(same[0])] = f.index
            out.causes[f.index] = pair_cause(s, f.index)
            out.levels[f.index] = out.levels.pop(same[0])
            out.origin[f.index] = out.origin.pop(same[0], "") + f", moved by the scan to {f.index}"
    # with the runs on both sides stored, every alert is re-placed where the change most likely is
    placed = locate(s.runs, out.alerts)
    for t, u in zip(sorted(out.alerts), placed, strict=True):
        if u != t:
            out.origin[u] = out.origin.pop(t, "") + f", located at {u}"
    out.alerts = placed
    out.causes = {t: pair_cause(s, t) for t in out.alerts}
    return out


def otava_peer() -> Callable[[int, Series], Outcome] | None:
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        return None

    def run(i: int, s: Series) -> Outcome:
        medians = [p.median_us for p in s.runs]
        points, _ = compute_change_points(medians, window_len=50, max_pvalue=0.001, min_magnitude=MIN_EFFECT)
        alerts = [cp.index for cp in points if cp.stats.forward_rel_change() >= MIN_EFFECT]
        return Outcome(alerts=alerts, causes={t: pair_cause(s, t) for t in alerts})

    return run


# ---- scoring ------------------------------------------------------------------------------------


def position(change: int) -> str:
    return "early" if change in EARLY else "late" if change in LATE else "middle"


@dataclass
class Score:
    tp: int = 0
    fp: int = 0
    comparisons: int = 0
    suspects: int = 0
    jobs: int = 0
    caught: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    fp_by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    exact: list[int] = field(default_factory=list)  # per caught step: attributed to the exact run pair
    exact_by: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # the same by size
    groups: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    chips: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # event -> chips alerted
    seconds: float = 0.0
    false_alerts: list[str] = field(default_factory=list)  # one line per false alert (--false-alerts)

    def add(self, s: Series, out: Outcome) -> None:
        self.comparisons += N_RUNS - MIN_HISTORY
        self.suspects += out.suspects
        self.jobs += out.jobs
        matched = False
        for t in out.alerts:
            if s.change is not None and not matched and s.change <= t <= s.window_end:
                matched = True
                self.tp += 1
                if s.kind in ("step", "multichip+"):
                    self.exact.append(int(self._exact(s, t, out.causes.get(t))))
                    self.exact_by[category(s)].append(self.exact[-1])
                if s.group is not None:
                    self.chips[s.group] += 1
                    self.groups[s.group].add(
                        group_key("rmsnorm", (f"chip {id(s)}", "rmsnorm", "s", "d"), out.causes.get(t, {}))
                    )
            else:
                self.fp += 1
                self.fp_by_kind[s.kind] += 1
                self.false_alerts.append(describe_false(s, out, t))
        if s.change is not None:
            self.caught[category(s)].append(int(matched))
            if s.kind in ("step", "multichip+"):
                self.caught[f"{category(s)} {position(s.change)}"].append(int(matched))

    @staticmethod
    def _exact(s: Series, t: int, cause: dict[str, list[str | None]] | None) -> bool:
        c, name = s.change, s.cause_attr
        if cause is None or name is None or c is None or t != c:
            return False
        return cause.get(name) == [s.attrs[c - 1][name], s.attrs[c][name]]

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")

    @property
    def false_per_1000(self) -> float:
        return 1000.0 * self.fp / self.comparisons

    @property
    def attribution(self) -> float:
        return float(np.mean(self.exact)) if self.exact else float("nan")

    def grouping(self) -> tuple[int, int]:
        """(events caught on both slowed chips that got one group key, events caught on both)."""
        both = [g for g, n in self.chips.items() if n >= 2]
        return sum(1 for g in both if len(self.groups[g]) == 1), len(both)


def describe_false(s: Series, out: Outcome, t: int) -> str:
    """One false alert: the series' kind, where the alert stands and where it came from, each run's
    median against the series' first level (bad runs marked ``!``, the labelled change ``|``)."""
    runs = []
    for i, p in enumerate(s.runs):
        mark = "|" if i == s.change else ""
        odd = "!" if s.bad[i] > 1 else ""
        at = "*" if i == t else ""
        runs.append(f"{mark}{at}{100 * (p.median_us / s.levels[0] - 1):+.1f}{odd}")
    change = f" at {s.change} ({s.effect:+.0%})" if s.change is not None else ""
    return (f"{s.kind}{change}: alert at {t} from {out.origin.get(t, '?')}; sigma_run "
            f"{s.sigma_run:.3f}, within {s.sigma_within:.3f}\n    " + " ".join(runs))


def category(s: Series) -> str:
    pct = f"{round(s.effect * 100)}%"
    return {"step": f"step {pct}", "drift": f"drift {pct}", "multichip+": f"some chips {pct}",
            "rebound": f"after an improvement {pct}"}[s.kind]


SIZES = ["step 3%", "step 5%", "step 10%", "step 20%", "some chips 10%"]
CATEGORIES = [*SIZES, "drift 10%", "drift 20%", "after an improvement 15%"]
POSITIONS = ("early", "middle", "late")


def evaluate(corpus: list[Series], method: Callable[[int, Series], Outcome]) -> Score:
    score = Score()
    start = time.perf_counter()
    for i, s in enumerate(corpus):
        score.add(s, method(i, s))
    score.seconds = time.perf_counter() - start
    return score


def _cell(hits: list[int]) -> str:
    return f"{np.mean(hits):.3f} ({len(hits)})" if hits else "-"


def combine(parts: list[Score]) -> Score:
    """Several corpora's scores as one: counts and outcomes summed (ratios are taken of the sums), the
    multi-chip events numbered anew so that no two corpora's events share a number."""
    out = Score()
    for sc in parts:
        out.tp += sc.tp
        out.fp += sc.fp
        out.comparisons += sc.comparisons
        out.suspects += sc.suspects
        out.jobs += sc.jobs
        out.seconds += sc.seconds
        out.exact += sc.exact
        out.false_alerts += sc.false_alerts
        for k, v in sc.caught.items():
            out.caught[k] += v
        for k, v in sc.exact_by.items():
            out.exact_by[k] += v
        for kind, n in sc.fp_by_kind.items():
            out.fp_by_kind[kind] += n
        base = max([*out.chips, *out.groups], default=-1) + 1
        for g, n in sc.chips.items():
            out.chips[base + g] = n
        for g, keys in sc.groups.items():
            out.groups[base + g] = set(keys)
    return out


# one corpus size and prevalence: its title, and per seed (in order) the seed, its corpus, its scores
Table = tuple[str, list[tuple[int, list[Series], dict[str, Score]]]]


def _row(label: str, sc: Score, width: int) -> str:
    grouped, events = sc.grouping()
    return (
        f"{label.ljust(width)}{sc.precision:9.3f}  {sc.false_per_1000:14.2f}  {sc.tp + sc.fp:6d}  "
        f"{sc.tp:4d}  {sc.fp:4d}  {sc.comparisons:11d}  {sc.suspects:8d}  "
        f"{100 * sc.suspects / sc.comparisons:11.2f}%  {sc.jobs:7d}  {sc.attribution:10.3f}  "
        f"{f'{grouped}/{events}':>7}  {sc.seconds:7.1f}"
    )


def _summary(table: Table) -> list[str]:
    """A corpus' table: per method the figures pooled over the seeds, then one row per seed."""
    title, per_seed = table
    names = list(per_seed[0][2])
    width = max(len(n) for n in names) + 2
    pooled = {n: combine([scores[n] for _, _, scores in per_seed]) for n in names}
    corpus = [s for _, c, _ in per_seed for s in c]
    kinds: dict[str, int] = defaultdict(int)
    for s in corpus:
        kinds[s.kind] += 1
    seeds = f" over {len(per_seed)} seeds ({len(per_seed[0][1])} each)" if len(per_seed) > 1 else ""
    lines = [
        f"{title}: {len(corpus)} series{seeds}, {sum(s.change is not None for s in corpus)} with a change; "
        + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())),
        "method".ljust(width) + "precision  false/1000 cmp  alerts    TP    FP  comparisons  suspects  "
        "suspect rate  re-runs  exact pair  grouped  seconds",
    ]
    for n in names:
        lines.append(_row(n, pooled[n], width))
        if len(per_seed) > 1:
            lines += [_row(f"  seed {seed}", scores[n], width) for seed, _, scores in per_seed]
    lines.append("  false alerts by series kind" + (", seeds pooled" if seeds else "") + ": " + "; ".join(
        f"{n}: " + ", ".join(f"{k} {pooled[n].fp_by_kind.get(k, 0)}" for k in sorted(kinds)) for n in names))
    return lines


BIG = ("step 10%", "step 20%", "some chips 10%")  # "all steps >= 10%"


def _rate(hits: list[int]) -> str:
    return f"{np.mean(hits):.3f}" if hits else "-"


def headline(low: Score, high: Score, positives: Score) -> str:
    """One line of the issue's figures: precision and false alerts per 1000 comparisons at 5 % (and
    68 %) prevalence; 5 % steps found (early / middle / late), steps >= 10 % found early / middle /
    late, and the exact pair, over the positives of both corpora."""
    five = " / ".join(_rate(positives.caught.get(f"step 5% {p}", [])) for p in POSITIONS)
    big = " / ".join(_rate([h for c in BIG for h in positives.caught.get(f"{c} {p}", [])]) for p in POSITIONS)
    return (f"5 %: precision {low.precision:.3f}, false {low.false_per_1000:.2f}/1000; 68 %: "
            f"{high.precision:.3f}, {high.false_per_1000:.2f}/1000; 5 % steps "
            f"{_rate(positives.caught.get('step 5%', []))} ({five}); >= 10 % {big}; "
            f"exact pair {_rate(positives.exact)}")


def report(tables: list[Table]) -> str:
    seeds = [seed for seed, _, _ in tables[0][1]]
    names = list(tables[0][1][0][2])
    width = max(len(n) for n in names) + 2
    held_out = ", ".join(str(s) for s in seeds if not 101 <= s <= 104)
    lines = [
        "Regression detector benchmark (benchmarks/detector.py)",
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        + (f" (held out: {held_out}" if held_out else " (")
        + ("; " if held_out else "") + "thresholds tuned on seed 101, re-placement on seeds 101-104); "
        f"{N_RUNS} runs x {SAMPLES} samples a series; "
        f"min effect {MIN_EFFECT:.0%}; bad runs +5-15 % ({BAD_RUN:.0%} of runs start one, "
        f"{BAD_PAIR:.0%} of them pairs); spikes +10-15 % (half) or +15-100 %",
        f"an alert is true at the first slower run c .. c+{TRUE_AFTER} (drift: end of ramp + {TRUE_AFTER}), "
        f"one per change; every other alert is false; comparisons: runs with >= {MIN_HISTORY} earlier runs",
        "suspect rate: online suspects per comparison; re-runs: confirmation jobs (each on a device); "
        "re-runs past a series' newest run come from a generator of its own (seed, corpus, series index)",
    ]
    if len(seeds) > 1:
        lines.append("pooled: true and false alerts, comparisons and positives summed over the seeds, "
                     "then the ratios; each seed's own row below its pooled one")
    lines.append("")
    for table in tables:
        lines += [*_summary(table), ""]
    # per method: each seed's positives of both corpora, and all of them
    by_seed = {n: [combine([t[1][k][2][n] for t in tables]) for k in range(len(seeds))] for n in names}
    pooled = {n: combine(by_seed[n]) for n in names}
    both = "both corpora" + (" and all seeds" if len(seeds) > 1 else "")
    if len(tables) == 2:
        for n in names:
            low, high = (combine([scores[n] for _, _, scores in t[1]]) for t in tables)
            lines += [f"headline, {n}: at 5 % and 68 % prevalence; recall and exact pair over both corpora",
                      f"  {'pooled' if len(seeds) > 1 else f'seed {seeds[0]}'}:".ljust(12)
                      + headline(low, high, pooled[n])]
            if len(seeds) > 1:
                for k, seed in enumerate(seeds):
                    lines.append(f"  seed {seed}:".ljust(12)
                                 + headline(tables[0][1][k][2][n], tables[1][1][k][2][n], by_seed[n][k]))
            lines.append("")
    header = "".join(n.rjust(width) for n in names)
    lines += [f"positives of {both} pooled; positions (first slower run, 1-based): early = runs 2-4, "
              "middle = 5-12, late = 13-15", "recall by effect size".ljust(width + 8) + header]
    for cat in CATEGORIES:
        lines.append(f"  {cat}".ljust(width + 8) + "".join(_cell(pooled[n].caught.get(cat, [])).rjust(width)
                                                          for n in names))
    lines.append(
        "  all steps >= 10%".ljust(width + 8)
        + "".join(_cell([h for c in BIG for h in pooled[n].caught.get(c, [])]).rjust(width) for n in names)
    )
    lines += ["", "recall by size and position".ljust(width + 8) + header]
    for cat in SIZES:
        for pos in POSITIONS:
            key = f"{cat} {pos}"
            lines.append(f"  {key}".ljust(width + 8)
                         + "".join(_cell(pooled[n].caught.get(key, [])).rjust(width) for n in names))
    for pos in POSITIONS:
        lines.append(
            f"  all >= 10% {pos}".ljust(width + 8)
            + "".join(_cell([h for c in BIG for h in pooled[n].caught.get(f"{c} {pos}", [])]).rjust(width)
                      for n in names)
        )
    lines += ["", "attribution to the exact run pair".ljust(width + 8) + header]
    for cat in SIZES:
        lines.append(f"  {cat}".ljust(width + 8)
                     + "".join(_cell(pooled[n].exact_by.get(cat, [])).rjust(width) for n in names))
    lines.append(
        "  all steps >= 10%".ljust(width + 8)
        + "".join(_cell([h for c in BIG for h in pooled[n].exact_by.get(c, [])]).rjust(width) for n in names)
    )
    lines += [
        "",
        "exact pair: share of caught steps (single- and multi-chip) whose alert is at the first slower run",
        "and whose cause names that run's and the previous run's value of the injected attribute.",
        "grouped: multi-chip events caught on both slowed chips whose two alerts share one group key (in",
        "half the events the OS updated at the upgrade's run on one slowed chip).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                       help="seeds, each its own corpora and re-runs, pooled in the report "
                            f"(default {' '.join(map(str, SEEDS))}: held out from the tuning)")
    which.add_argument("--seed", type=int, help="one seed (the same as --seeds SEED)")
    parser.add_argument("--series", type=int, default=2000, help="series at 5 %% prevalence (default 2000)")
    parser.add_argument("--series-68", type=int, default=700,
                        help="series at 68 %% prevalence (default 700)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-peer", action="store_true", help="skip apache-otava (not installed)")
    parser.add_argument("--false-alerts", action="store_true",
                        help="print each false alert of ours (series kind, origin, run medians) to stderr")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else args.seeds
    peer = None if args.no_peer else otava_peer()
    if not args.no_peer and peer is None:
        print("apache-otava is not installed: pip install -e '.[bench]' (or pass --no-peer)", file=sys.stderr)
        return 2
    high = "at 68 % prevalence (labelled: most series carry a change)"
    tables: list[Table] = []
    for table, (title, n, prevalence) in enumerate(
        (("at 5 % prevalence", args.series, 0.05), (high, args.series_68, 0.68))
    ):
        per_seed = []
        for seed in seeds:
            corpus = build_corpus(seed, n, prevalence)
            scores = {"ours (step+confirm+scan)": evaluate(corpus, ours(seed, table))}
            if peer is not None:
                scores["apache-otava 0.8"] = evaluate(corpus, peer)
            per_seed.append((seed, corpus, scores))
        tables.append((title, per_seed))
    text = report(tables)
    if args.false_alerts:
        for title, per_seed in tables:
            for seed, _, scores in per_seed:
                lines = scores["ours (step+confirm+scan)"].false_alerts
                print(f"false alerts {title}, seed {seed} ({len(lines)}):", *lines, sep="\n", file=sys.stderr)
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
