"""Prediction confidence, calibrated on held-out data.

For one backend's observations, every measured (chip, kernel, shape, dtype) with at least two
correct configs is held out in turn and predicted from the rest (:func:`held_out`), twice:

- ``own``: everything else, the chip's other shapes included (a chip filling its own gaps);
- ``cross``: without any of that chip's results for the kernel (a chip predicted from others only).
  Where another chip measured the very shape and its measured pick decides
  (:func:`kernelfleet.service.predict.predict`'s transfer), the sample is a ``transfer``: its score
  is how surely the source's pick beat the built-in there, so it is binned on its own.

A prediction *hits* when its config's measured time on the held-out shape is within 5 % of that
shape's tuned best (built-in included): the chip's own measured pick, what its profile holds, where
``picks`` gives it (not the least of every config's center: over 60-odd configs measured a few times
each, some eliminated early by successive halving, the least is biased low and calls hits misses);
else the least center. A config the held-out chip did not measure counts as a miss, so the rate errs
low. Raw scores are binned (:data:`EDGES`); a bin's observed hit rate gets one pseudo-hit and one
pseudo-miss ((hits + 1) / (n + 2)), so a bin with little data says little. A score is built so that
more of it means a likelier hit, so each mode's rates are then made non-decreasing in the score by
isotonic regression (``scipy.optimize.isotonic_regression``, weighted by n + 2: adjacent
bins that disagree with the order are pooled), as calibration of a monotone score is usually done:
with ten-odd samples a bin, a lone low bin above high ones is noise, not signal. An empty bin takes
the least rate the order allows it: the nearest filled bin's below it; with none below, the prior 0.5
or the nearest filled bin's above, whichever is less (a bin nothing was measured in borrows no
confidence from the scores above it); 0.5 where the mode has no sample.
:func:`confidence` maps a new prediction's score to its bin's rate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.service.predict import NEAR, Observations, Picks, Prediction, predict

EDGES = (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0000001)
MAX_HELD_OUT = 500  # series held out per calibration (a stable sample of them beyond that)
MODES = ("own", "cross", "transfer")


@dataclass(frozen=True)
class Sample:
    mode: str
    score: float
    hit: bool
    chip: str
    kernel: str
    shape: str
    dtype: str


def _hit(pick: Prediction, times: dict[str, float], tuned: str | None = None) -> bool:
    best = times[tuned] if tuned in times else min(times.values())
    return pick.config_key in times and times[pick.config_key] <= NEAR * best


def held_out(observations: Observations,
             valid: Callable[[str, str, str], Callable[[str], bool] | None] | None = None,
             limit: int = MAX_HELD_OUT, picks: Picks | None = None) -> list[Sample]:
    """Leave-one-out samples (every mode) over every series with at least two measured configs; past
    ``limit`` series, a stable sample of them (by a hash of the series), so a calibration's cost
    stays bounded as the fleet grows (each prediction is O(the kernel's sources)). ``picks``: the
    chips' measured picks, as profiles pass them to the predictor."""
    series = sorted(((chip, key) for chip, table in observations.items()
                     for key, times in table.items() if len(times) >= 2),
                    key=lambda s: hashlib.sha256(repr(s).encode()).hexdigest())[:limit]
    samples: list[Sample] = []
    for chip, (kernel, shape, dtype) in series:
        table = observations[chip]
        times = table[(kernel, shape, dtype)]
        check = valid(kernel, shape, dtype) if valid else None
        mine = {(chip, k, s, d) for (k, s, d) in table if k == kernel}
        for mode, exclude in (("own", {(chip, kernel, shape, dtype)}), ("cross", mine)):
            pick = predict(chip, kernel, shape, dtype, observations, valid=check, exclude=exclude,
                           picks=picks)
            if pick is None or (mode == "own") == pick.cross_chip:
                continue  # no own-chip source left: that case is the cross mode's
            tuned = picks.get((chip, kernel, shape, dtype)) if picks else None
            samples.append(Sample(pick.mode, pick.score, _hit(pick, times, tuned and tuned.config_key),
                                  chip, kernel, shape, dtype))
    return samples


def bins(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One row per (mode, score bin): its range, samples, hits and calibrated rate (monotone in the
    score within a mode)."""
    out: list[dict[str, Any]] = []
    for mode in MODES:
        rows: list[dict[str, Any]] = []
        for lo, hi in zip(EDGES, EDGES[1:], strict=False):
            inside = [s for s in samples if s.mode == mode and lo <= s.score < hi]
            rows.append({"mode": mode, "lo": lo, "hi": min(hi, 1.0), "n": len(inside),
                         "hits": sum(s.hit for s in inside)})
        filled = [r for r in rows if r["n"]]
        if filled:
            from scipy.optimize import isotonic_regression  # here: a second of every coordinator's start

            fit = isotonic_regression([(r["hits"] + 1) / (r["n"] + 2) for r in filled],
                                      weights=[r["n"] + 2 for r in filled]).x
            for r, rate in zip(filled, fit, strict=True):
                r["rate"] = float(rate)
        for i, r in enumerate(rows):
            if not r["n"]:
                below = [x["rate"] for x in rows[:i] if x["n"]]
                above = [x["rate"] for x in rows[i + 1:] if x["n"]]
                r["rate"] = below[-1] if below else min(0.5, above[0]) if above else 0.5
        out += rows
    return out


def confidence(table: Sequence[dict[str, Any]] | None, pick: Prediction) -> float:
    """The calibrated confidence of ``pick``: its (mode, score) bin's observed hit rate; 0.5 (no
    information) without a calibration."""
    if not table:
        return 0.5
    mode = pick.mode
    for row in table:
        upper = row["hi"] if row["hi"] < 1.0 else EDGES[-1]
        if row["mode"] == mode and row["lo"] <= pick.score < upper:
            return float(row["rate"])
    return 0.5
