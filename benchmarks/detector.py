"""Regression detector benchmark: KernelFleet's detector against apache-otava on labelled synthetic series.

Run it in an environment with the ``bench`` extra (apache-otava pins numpy 2.2 and scipy 1.16, so
give it its own venv)::

    python -m venv .venv-bench && .venv-bench/bin/pip install -e '.[bench]'
    .venv-bench/bin/python benchmarks/detector.py            # writes benchmarks/results/detector.txt

The data (seeded, so every run sees the same series):

- each series is one (kernel, shape, dtype, chip); each run has 50 raw samples; the noise has three
  layers: within-run spread (lognormal, 1-5 %, plus 2 % heavy-tail samples), run-to-run variance of
  the run's center (0.5-2 %) and outlier runs (2 % of runs are 8-40 % slower as a whole);
- labelled positives: steps of 2, 3, 5, 10 and 20 %; gradual drifts of 10 and 20 % over 10-20 runs;
  a cause (an MLX upgrade) that slows only some of the chips it reaches, by 10 %;
- labelled negatives: plain noise; single-run spikes (20-100 %), which must not alert; the chips that
  got the same MLX upgrade without slowing down; benign environment changes (OS updates) at random.

Our detector runs as the coordinator runs it: the online step detector on every new run against
the last ``history`` runs, a confirmation re-run (a fresh draw at the same true level, as a re-run
on the same chip would be) before alerting, and the offline change-point pass over the whole
series afterwards, adding what the online detector did not cover. The peer, apache-otava (Hunter's
E-divisive means with a t-test merge step), sees the per-run medians of the whole series, as it
does in CI; both use the same 3 % minimum effect.

Scoring: an alert at run ``t`` is a true positive when the series has a labelled change at ``c``
and ``c - 2 <= t <= c + 10`` (the end of the ramp + 10 for drifts), at most one per change; every
other alert is false. Comparisons: one per run that has at least 5 earlier runs (the same
denominator for every method).
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

from kernelfleet.service.regressions.attribution import attribute, group_key, reference_runs
from kernelfleet.service.regressions.base import RunPoint
from kernelfleet.service.regressions.changepoint import ChangePointDetector
from kernelfleet.service.regressions.step import StepDetector

N_RUNS = 60
SAMPLES = 50
HISTORY = 20  # settings.regression_history_runs
MIN_EFFECT = 0.03  # settings.regression_min_effect
MIN_HISTORY = 5
COVER = 10  # an offline finding within this many runs of an alert is the same change
OUT = Path(__file__).parent / "results" / "detector.txt"


@dataclass
class Series:
    kind: str  # null | step | drift | spike | multichip+ | multichip-
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
    """One run at time ``t``: run-to-run offset, 2 % outlier runs, 50 lognormal samples with a tail."""
    center = s.levels[t] * np.exp(rng.normal(0.0, s.sigma_run)) * spike
    if rng.random() < 0.02:
        center *= rng.uniform(1.08, 1.4)
    samples = center * np.exp(rng.normal(0.0, s.sigma_within, SAMPLES))
    tail = rng.random(SAMPLES) < 0.02
    samples[tail] *= rng.uniform(1.2, 3.0, int(tail.sum()))
    return RunPoint(
        median_us=float(np.median(samples)),
        samples_us=tuple(float(v) for v in samples),
        n=SAMPLES,
        attrs=s.attrs[t],
    )


def make_attrs(
    rng: np.random.Generator, change: int | None, cause: str | None
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
    if rng.random() < 0.3:  # a benign OS update somewhere
        for a in attrs[int(rng.integers(10, N_RUNS)) :]:
            a["os"] = "macOS 15.2"
    if change is not None and cause is not None:
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
) -> Series:
    base = float(np.exp(rng.uniform(np.log(10), np.log(5000))))
    levels = np.full(N_RUNS, base)
    positive = kind in ("step", "drift", "multichip+")
    if kind in ("step", "drift", "multichip+", "multichip-", "spike") and change is None:
        change = int(rng.integers(25, 45))
    if positive and change is not None:
        ramp_frac = np.clip((np.arange(N_RUNS) - change + 1) / max(ramp, 1), 0.0, 1.0)
        levels = base * (1.0 + effect * ramp_frac)
    if cause is None and kind in ("step", "drift"):
        cause = str(rng.choice(["mlx_version", "kernel_hash", "driver", "os"]))
    attrs = make_attrs(rng, change if kind != "spike" else None, cause if kind != "spike" else None)
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
    corpus += [make_series(rng, "null", 0.0) for _ in range(4 * scale)]
    for effect in (0.02, 0.03, 0.05, 0.10, 0.20):
        corpus += [make_series(rng, "step", effect) for _ in range(2 * scale)]
    for effect in (0.10, 0.20):
        corpus += [
            make_series(rng, "drift", effect, ramp=int(rng.integers(10, 21))) for _ in range(2 * scale)
        ]
    corpus += [make_series(rng, "spike", 0.0) for _ in range(2 * scale)]
    for g in range(scale):  # one MLX upgrade reaches 4 chips at once and slows down 2 of them
        change = int(rng.integers(25, 45))
        for chip in range(4):
            kind = "multichip+" if chip < 2 else "multichip-"
            corpus.append(make_series(rng, kind, 0.10, change=change, cause="mlx_version", group=g))
    return corpus


# ---- methods: each returns the alert indices for one series ------------------------------------


@dataclass
class Outcome:
    alerts: list[int]
    suspects: int = 0
    causes: dict[int, dict[str, list[str | None]]] = field(default_factory=dict)


def ours_online(s: Series, rng: np.random.Generator, *, confirm: bool) -> Outcome:
    det = StepDetector()
    out = Outcome(alerts=[])
    start = 0
    for t in range(N_RUNS):
        history = s.runs[max(start, t - HISTORY) : t]
        finding = det.check(history, s.runs[t], MIN_EFFECT)
        if finding is None:
            continue
        out.suspects += 1
        if confirm and not det.confirms(history, finding, draw_run(rng, s, t), MIN_EFFECT):
            continue
        out.alerts.append(t)
        out.causes[t] = attribute(reference_runs(history, MIN_EFFECT), s.runs[t])
        start = t  # the new level is the baseline from here on
    return out


def ours_offline(s: Series) -> Outcome:
    return Outcome(alerts=[f.index for f in ChangePointDetector().scan(s.runs, MIN_EFFECT)])


def ours_combined(s: Series, rng: np.random.Generator) -> Outcome:
    out = ours_online(s, rng, confirm=True)
    for f in ChangePointDetector().scan(s.runs, MIN_EFFECT):
        if all(abs(f.index - t) > COVER for t in out.alerts):
            out.alerts.append(f.index)
            out.causes[f.index] = attribute([s.runs[i] for i in f.baseline_indices], s.runs[f.index])
    out.alerts.sort()
    return out


def otava_peer() -> Callable[[Series], Outcome] | None:
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        return None

    def run(s: Series) -> Outcome:
        medians = [p.median_us for p in s.runs]
        points, _ = compute_change_points(medians, window_len=50, max_pvalue=0.001, min_magnitude=MIN_EFFECT)
        return Outcome(alerts=[cp.index for cp in points if cp.stats.forward_rel_change() >= MIN_EFFECT])

    return run


# ---- scoring ------------------------------------------------------------------------------------


@dataclass
class Score:
    tp: int = 0
    fp: int = 0
    comparisons: int = 0
    suspects: int = 0
    caught: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    fp_by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    attributed: list[int] = field(default_factory=list)
    groups: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    seconds: float = 0.0

    def add(self, s: Series, out: Outcome) -> None:
        self.comparisons += N_RUNS - MIN_HISTORY
        self.suspects += out.suspects
        matched = False
        for t in out.alerts:
            if s.change is not None and not matched and s.change - 2 <= t <= s.window_end:
                matched = True
                self.tp += 1
                cause = out.causes.get(t)
                if cause is not None and s.cause_attr is not None:
                    self.attributed.append(int(s.cause_attr in cause))
                if cause is not None and s.group is not None:
                    self.groups[s.group].add(group_key("rmsnorm", ("chip", "rmsnorm", "s", "d"), cause))
            else:
                self.fp += 1
                self.fp_by_kind[s.kind] += 1
        if s.change is not None:
            self.caught[category(s)].append(int(matched))

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else float("nan")

    @property
    def false_per_1000(self) -> float:
        return 1000.0 * self.fp / self.comparisons


def category(s: Series) -> str:
    pct = f"{round(s.effect * 100)}%"
    return {"step": f"step {pct}", "drift": f"drift {pct}", "multichip+": f"some chips {pct}"}[s.kind]


CATEGORIES = [
    "step 2%",
    "step 3%",
    "step 5%",
    "step 10%",
    "step 20%",
    "drift 10%",
    "drift 20%",
    "some chips 10%",
]


def evaluate(corpus: list[Series], method: Callable[[Series], Outcome]) -> Score:
    score = Score()
    start = time.perf_counter()
    for s in corpus:
        score.add(s, method(s))
    score.seconds = time.perf_counter() - start
    return score


def report(scores: dict[str, Score], corpus: list[Series], seed: int) -> str:
    names = list(scores)
    width = max(len(n) for n in names) + 2
    kinds = defaultdict(int)
    for s in corpus:
        kinds[s.kind] += 1
    lines = [
        "Regression detector benchmark (benchmarks/detector.py)",
        f"seed {seed}; {len(corpus)} series x {N_RUNS} runs x {SAMPLES} samples; "
        + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())),
        f"min effect {MIN_EFFECT:.0%}; history {HISTORY} runs; an alert counts within [c-2, c+{COVER}] "
        "(drift: end of ramp + 10)",
        "",
        "method".ljust(width) + "precision  false/1000 cmp  alerts  TP   FP   suspects  seconds",
    ]
    for n in names:
        sc = scores[n]
        lines.append(
            f"{n.ljust(width)}{sc.precision:9.3f}  {sc.false_per_1000:14.2f}  {sc.tp + sc.fp:6d}  "
            f"{sc.tp:3d}  {sc.fp:3d}  {sc.suspects:8d}  {sc.seconds:7.1f}"
        )
    lines += ["", "recall by effect size".ljust(width + 2) + "".join(n.rjust(width) for n in names)]
    for cat in CATEGORIES:
        row = f"  {cat}".ljust(width + 2)
        for n in names:
            hits = scores[n].caught.get(cat, [])
            row += (f"{np.mean(hits):.3f} ({len(hits)})" if hits else "-").rjust(width)
        lines.append(row)
    big = [c for c in CATEGORIES if any(x in c for x in ("10%", "20%"))]
    row = "  all >= 10%".ljust(width + 2)
    for n in names:
        hits = [h for c in big for h in scores[n].caught.get(c, [])]
        row += f"{np.mean(hits):.3f} ({len(hits)})".rjust(width)
    lines.append(row)
    lines += ["", "false alerts by series kind".ljust(width + 2) + "".join(n.rjust(width) for n in names)]
    for kind in sorted(kinds):
        lines.append(
            f"  {kind}".ljust(width + 2)
            + "".join(str(scores[n].fp_by_kind.get(kind, 0)).rjust(width) for n in names)
        )
    ours = scores.get("ours (step+confirm+scan)")
    if ours is not None:
        attributed = ours.attributed
        groups = ours.groups
        lines += [
            "",
            "ours: attribution and grouping",
            f"  caught changes whose injected cause is in the attribution: "
            f"{sum(attributed)}/{len(attributed)}",
            f"  multi-chip causes: {len(groups)} with alerts; "
            f"{sum(1 for g in groups.values() if len(g) == 1)} of them grouped into exactly one alert "
            "(group_key)",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--scale", type=int, default=100, help="series per unit (default 100 -> 2,500 series)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-peer", action="store_true", help="skip apache-otava (not installed)")
    args = parser.parse_args(argv)
    corpus = build_corpus(args.seed, args.scale)
    rng = np.random.default_rng(args.seed + 1)
    scores = {
        "ours (step, no confirm)": evaluate(corpus, lambda s: ours_online(s, rng, confirm=False)),
        "ours (step+confirm)": evaluate(corpus, lambda s: ours_online(s, rng, confirm=True)),
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
