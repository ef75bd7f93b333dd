"""Regression detector benchmark: KernelFleet's detector against apache-otava on labelled synthetic series.

Run it in an environment with the ``bench`` extra (apache-otava pins numpy 2.2 and scipy 1.16, so
give it its own venv)::

    python -m venv .venv-bench && .venv-bench/bin/pip install -e '.[bench]'
    .venv-bench/bin/python benchmarks/detector.py            # writes benchmarks/results/detector.txt

The data (seeded, so every run sees the same series): short series of 15 runs, as a chip's history
is when a kernel or shape is new, so that changes near either end are as common as in the middle.

- each series is one (kernel, shape, dtype, chip); each run has 50 raw samples; the noise has three
  layers: within-run spread (lognormal, 1-5 %, plus 5 % heavy-tail samples), run-to-run wander of
  the run's center (0.5-2 %) and bad runs (3 % of runs are 5-10 % slower as a whole);
- labelled positives: steps of 2, 3, 5, 10 and 20 % at every position (the first slower run is run
  2 to 15, so runs 2-4 are "early", 5-12 "middle", 13-15 "late"); drifts of 10 and 20 % over 4-8
  runs; multi-chip events: an MLX upgrade reaches 4 chips at the same run and slows 2 of them by
  10 %, in series where *every* run has a different MLX version (so only the exact pair of runs
  around the change names the right upgrade);
- labelled negatives: plain noise; single-run spikes (20-100 %); improvements (5-20 % faster);
  the chips that got the multi-chip upgrade without slowing down; benign OS updates at random.

Our detector runs as the coordinator runs it: the online step detector on every new run against
the runs since its baseline started (at most the last ``history``); a suspect waits for its
confirmation re-run, for which the next run stands in (a suspect at the newest run keeps waiting
and gets a fresh re-run at the same true level, as the confirm job would bring); a confirmed alert
restarts the baseline at its first slower run; then the offline scan over the whole series adds
what no alert covers (an alert within 2 runs is the same change) and re-places every alert where its
change most likely is (:func:`kernelfleet.service.regressions.locate.locate`, as the coordinator's
scan does). Every single-chip step here coincides with a recorded attribute change, which
``locate``'s prior favours; in multi-chip series every run pair changed the MLX version, so there
the prior is flat. The peer, apache-otava (Hunter's
E-divisive means with a t-test merge step), sees the per-run medians of the whole series, as it
does in CI; both use the same 3 % minimum effect.

Scoring: an alert at run ``t`` is a true positive when the series has a labelled change at ``c``
and ``c - 2 <= t <= c + 10`` (the end of the ramp + 10 for drifts), at most one per change; every
other alert is false. Comparisons: one per run that has at least 2 earlier runs (the same
denominator for every method). Attribution is exact when the alert's run is the first slower run
``c`` and its cause names the injected attribute's values of runs ``c - 1`` and ``c``; a multi-chip
event is grouped when every chip that alerted on it got the same group key.

The detector's thresholds were tuned on ``--seed 101``; the committed results use ``--seed 7``.
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
COVER = 10  # scoring window after a change
EXTEND_RUNS = 6  # engine.EXTEND_RUNS: a slowdown this soon after an alert extends it
EARLY, LATE = range(1, 4), range(N_RUNS - 3, N_RUNS)  # 0-based index of the first slower run
OUT = Path(__file__).parent / "results" / "detector.txt"


@dataclass
class Series:
    kind: str  # null | step | drift | spike | improvement | multichip+ | multichip-
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


def draw_run(rng: np.random.Generator, s: Series, t: int, *, spike: float = 1.0) -> RunPoint:
    """One run at time ``t``: run-to-run offset, 3 % bad runs, 50 lognormal samples with a tail."""
    center = s.levels[t] * np.exp(rng.normal(0.0, s.sigma_run)) * spike
    if rng.random() < 0.03:
        center *= rng.uniform(1.05, 1.10)
    samples = center * np.exp(rng.normal(0.0, s.sigma_within, SAMPLES))
    tail = rng.random(SAMPLES) < 0.05
    samples[tail] *= rng.uniform(1.2, 3.0, int(tail.sum()))
    return RunPoint(
        median_us=float(np.median(samples)),
        samples_us=tuple(float(v) for v in samples),
        n=SAMPLES,
        attrs=s.attrs[t],
    )


def make_attrs(
    rng: np.random.Generator, change: int | None, cause: str | None, versions: list[str] | None = None
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
    if rng.random() < 0.3:  # a benign OS update somewhere
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
) -> Series:
    base = float(np.exp(rng.uniform(np.log(10), np.log(5000))))
    levels = np.full(N_RUNS, base)
    positive = kind in ("step", "drift", "multichip+")
    if change is None and kind != "null":
        change = int(rng.integers(1, N_RUNS - max(ramp - 1, 0)))
    if kind in ("step", "drift", "multichip+", "improvement") and change is not None:
        ramp_frac = np.clip((np.arange(N_RUNS) - change + 1) / max(ramp, 1), 0.0, 1.0)
        levels = base * (1.0 + effect * ramp_frac)
    if cause is None and kind in ("step", "drift"):
        cause = str(rng.choice(["mlx_version", "kernel_hash", "driver", "os"]))
    attrs = make_attrs(rng, change if positive else None, cause if positive else None, versions)
    s = Series(
        kind=kind,
        effect=effect if positive else 0.0,
        change=change if positive else None,
        window_end=(change or 0) + ramp + COVER,
        levels=levels,
        sigma_run=rng.uniform(0.005, 0.02),
        sigma_within=rng.uniform(0.01, 0.05),
        attrs=attrs,
        cause_attr=cause if positive else None,
        group=group,
    )
    spike_at = change if kind == "spike" else None
    s.runs = [
        draw_run(rng, s, t, spike=rng.uniform(1.2, 2.0) if t == spike_at else 1.0) for t in range(N_RUNS)
    ]
    return s


def build_corpus(seed: int, scale: int) -> list[Series]:
    rng = np.random.default_rng(seed)
    corpus: list[Series] = []
    corpus += [make_series(rng, "null", 0.0) for _ in range(3 * scale)]
    for effect in (0.02, 0.03, 0.05, 0.10, 0.20):
        corpus += [make_series(rng, "step", effect) for _ in range(3 * scale)]
    for effect in (0.10, 0.20):
        corpus += [make_series(rng, "drift", effect, ramp=int(rng.integers(4, 9))) for _ in range(scale)]
    corpus += [make_series(rng, "spike", 0.0) for _ in range(2 * scale)]
    corpus += [make_series(rng, "improvement", -float(rng.uniform(0.05, 0.2))) for _ in range(2 * scale)]
    for g in range(scale):  # one MLX upgrade reaches 4 chips at once and slows down 2 of them
        change = int(rng.integers(1, N_RUNS))
        first = int(rng.integers(20, 80))
        versions = [f"0.{first + t}.0" for t in range(N_RUNS)]
        for chip in range(4):
            kind = "multichip+" if chip < 2 else "multichip-"
            corpus.append(
                make_series(
                    rng, kind, 0.10, change=change, cause="mlx_version", group=g, versions=versions
                )
            )
    return corpus


# ---- methods: each returns the alert indices for one series ------------------------------------


@dataclass
class Outcome:
    alerts: list[int]
    suspects: int = 0
    causes: dict[int, dict[str, list[str | None]]] = field(default_factory=dict)
    levels: dict[int, tuple[float, float]] = field(default_factory=dict)  # (baseline, new) medians


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
        # the next run stands in for the confirmation re-run; at the newest run the suspect waits
        # for the re-run itself (a fresh draw at the same true level)
        rerun = s.runs[t + 1] if t + 1 < N_RUNS else draw_run(rng, s, t)
        joint = det.confirms([*history, s.runs[t]], finding, rerun, MIN_EFFECT)
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
            start = index  # the new level is the baseline from here on
        t += 2
    return out


def ours_offline(s: Series) -> Outcome:
    found = ChangePointDetector().scan(s.runs, MIN_EFFECT)
    return Outcome(alerts=[f.index for f in found], causes={f.index: pair_cause(s, f.index) for f in found})


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
        elif relocates(same[0], f, MIN_EFFECT) and f.index not in out.alerts:
            # the scan, with runs on both sides of the change, moves the alert to its run pair
            out.alerts[out.alerts.index(same[0])] = f.index
            out.causes[f.index] = pair_cause(s, f.index)
            out.levels[f.index] = out.levels.pop(same[0])
    # with the runs on both sides stored, every alert is re-placed where the change most likely is
    out.alerts = locate(s.runs, out.alerts)
    out.causes = {t: pair_cause(s, t) for t in out.alerts}
    return out


def otava_peer() -> Callable[[Series], Outcome] | None:
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        return None

    def run(s: Series) -> Outcome:
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
    caught: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    fp_by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    exact: list[int] = field(default_factory=list)  # per caught step: attributed to the exact run pair
    exact_by: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # the same by size
    groups: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    chips: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # event -> chips alerted
    seconds: float = 0.0

    def add(self, s: Series, out: Outcome) -> None:
        self.comparisons += N_RUNS - MIN_HISTORY
        self.suspects += out.suspects
        matched = False
        for t in out.alerts:
            if s.change is not None and not matched and s.change - 2 <= t <= s.window_end:
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


def category(s: Series) -> str:
    pct = f"{round(s.effect * 100)}%"
    return {"step": f"step {pct}", "drift": f"drift {pct}", "multichip+": f"some chips {pct}"}[s.kind]


SIZES = ["step 2%", "step 3%", "step 5%", "step 10%", "step 20%", "some chips 10%"]
CATEGORIES = [*SIZES, "drift 10%", "drift 20%"]
POSITIONS = ("early", "middle", "late")


def evaluate(corpus: list[Series], method: Callable[[Series], Outcome]) -> Score:
    score = Score()
    start = time.perf_counter()
    for s in corpus:
        score.add(s, method(s))
    score.seconds = time.perf_counter() - start
    return score


def _cell(hits: list[int]) -> str:
    return f"{np.mean(hits):.3f} ({len(hits)})" if hits else "-"


def report(scores: dict[str, Score], corpus: list[Series], seed: int) -> str:
    names = list(scores)
    width = max(len(n) for n in names) + 2
    kinds: dict[str, int] = defaultdict(int)
    for s in corpus:
        kinds[s.kind] += 1
    lines = [
        "Regression detector benchmark (benchmarks/detector.py)",
        f"seed {seed} (thresholds tuned on seed 101); {len(corpus)} series x {N_RUNS} runs x {SAMPLES} "
        "samples; " + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())),
        f"min effect {MIN_EFFECT:.0%}; an alert counts within [c-2, c+{COVER}] (drift: end of ramp + 10); "
        f"comparisons: runs with >= {MIN_HISTORY} earlier runs",
        "positions (first slower run, 1-based): early = runs 2-4, middle = 5-12, late = 13-15",
        "",
        "method".ljust(width)
        + "precision  false/1000 cmp  alerts    TP    FP  suspects  exact pair  grouped  seconds",
    ]
    for n in names:
        sc = scores[n]
        grouped, events = sc.grouping()
        lines.append(
            f"{n.ljust(width)}{sc.precision:9.3f}  {sc.false_per_1000:14.2f}  {sc.tp + sc.fp:6d}  "
            f"{sc.tp:4d}  {sc.fp:4d}  {sc.suspects:8d}  {sc.attribution:10.3f}  "
            f"{f'{grouped}/{events}':>7}  {sc.seconds:7.1f}"
        )
    header = "".join(n.rjust(width) for n in names)
    lines += ["", "recall by effect size".ljust(width + 8) + header]
    for cat in CATEGORIES:
        lines.append(f"  {cat}".ljust(width + 8) + "".join(_cell(scores[n].caught.get(cat, [])).rjust(width)
                                                          for n in names))
    big = ("step 10%", "step 20%", "some chips 10%")
    lines.append(
        "  all steps >= 10%".ljust(width + 8)
        + "".join(_cell([h for c in big for h in scores[n].caught.get(c, [])]).rjust(width) for n in names)
    )
    lines += ["", "recall by size and position".ljust(width + 8) + header]
    for cat in SIZES:
        for pos in POSITIONS:
            key = f"{cat} {pos}"
            lines.append(f"  {key}".ljust(width + 8)
                         + "".join(_cell(scores[n].caught.get(key, [])).rjust(width) for n in names))
    for pos in POSITIONS:
        lines.append(
            f"  all >= 10% {pos}".ljust(width + 8)
            + "".join(_cell([h for c in big for h in scores[n].caught.get(f"{c} {pos}", [])]).rjust(width)
                      for n in names)
        )
    lines += ["", "attribution to the exact run pair".ljust(width + 8) + header]
    for cat in SIZES:
        lines.append(f"  {cat}".ljust(width + 8) + "".join(_cell(scores[n].exact_by.get(cat, [])).rjust(width)
                                                          for n in names))
    lines.append(
        "  all steps >= 10%".ljust(width + 8)
        + "".join(_cell([h for c in big for h in scores[n].exact_by.get(c, [])]).rjust(width) for n in names)
    )
    lines += ["", "false alerts by series kind".ljust(width + 8) + header]
    for kind in sorted(kinds):
        lines.append(
            f"  {kind}".ljust(width + 8)
            + "".join(str(scores[n].fp_by_kind.get(kind, 0)).rjust(width) for n in names)
        )
    lines += [
        "",
        "exact pair: share of caught steps (single- and multi-chip) whose alert is at the first slower run",
        "and whose cause names that run's and the previous run's value of the injected attribute.",
        "grouped: multi-chip events caught on both slowed chips whose two alerts share one group key.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--scale", type=int, default=100, help="series per unit (default 100 -> 2,800 series)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-peer", action="store_true", help="skip apache-otava (not installed)")
    args = parser.parse_args(argv)
    corpus = build_corpus(args.seed, args.scale)
    rng = np.random.default_rng(args.seed + 1)
    scores = {
        "ours (step+confirm)": evaluate(corpus, lambda s: ours_online(s, rng)),
        "ours (scan only)": evaluate(corpus, ours_offline),
        "ours (step+confirm+scan)": evaluate(corpus, lambda s: ours_combined(s, rng)),
    }
    if not args.no_peer:
        peer = otava_peer()
        if peer is None:
            print(
                "apache-otava is not installed: pip install -e '.[bench]' (or pass --no-peer)",
                file=sys.stderr,
            )
            return 2
        scores["apache-otava 0.8"] = evaluate(corpus, peer)
    text = report(scores, corpus, args.seed)
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
