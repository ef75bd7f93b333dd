"""Prediction confidence, calibrated on held-out data.

For one backend's observations, every measured (chip, kernel, shape, dtype) with at least two
correct configs is held out in turn and predicted from the rest (:func:`held_out`), twice:

- ``own``: everything else, the chip's other shapes included (a chip filling its own gaps);
- ``cross``: without any of that chip's results for the kernel (a chip predicted from others only).

A prediction *hits* when its config's measured time on the held-out shape is within 5 % of that
shape's tuned best (built-in included); a config the held-out run did not measure counts as a miss,
so the rate errs low. Raw scores are binned (:data:`EDGES`); a bin's confidence is its observed hit
rate with one pseudo-hit and one pseudo-miss ((hits + 1) / (n + 2)), so a bin with little data says
little. :func:`confidence` maps a new prediction's score to its bin's rate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kernelfleet.service.predict import NEAR, Observations, Prediction, predict

EDGES = (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0000001)
MAX_HELD_OUT = 500  # series held out per calibration (a stable sample of them beyond that)
MODES = ("own", "cross")


@dataclass(frozen=True)
class Sample:
    mode: str
    score: float
    hit: bool
    chip: str
    kernel: str
    shape: str
    dtype: str


def _hit(pick: Prediction, times: dict[str, float]) -> bool:
    return pick.config_key in times and times[pick.config_key] <= NEAR * min(times.values())


def held_out(observations: Observations,
             valid: Callable[[str, str, str], Callable[[str], bool] | None] | None = None,
             limit: int = MAX_HELD_OUT) -> list[Sample]:
    """Leave-one-out samples (both modes) over every series with at least two measured configs; past
    ``limit`` series, a stable sample of them (by a hash of the series), so a calibration's cost
    stays bounded as the fleet grows (each prediction is O(the kernel's sources))."""
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
            pick = predict(chip, kernel, shape, dtype, observations, valid=check, exclude=exclude)
            if pick is None or (mode == "own") == pick.cross_chip:
                continue  # no own-chip source left: that case is the cross mode's
            samples.append(Sample(mode, pick.score, _hit(pick, times), chip, kernel, shape, dtype))
    return samples


def bins(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One row per (mode, score bin): its range, samples, hits and calibrated rate."""
    out: list[dict[str, Any]] = []
    for mode in MODES:
        for lo, hi in zip(EDGES, EDGES[1:], strict=False):
            inside = [s for s in samples if s.mode == mode and lo <= s.score < hi]
            hits = sum(s.hit for s in inside)
            out.append({"mode": mode, "lo": lo, "hi": min(hi, 1.0), "n": len(inside), "hits": hits,
                        "rate": (hits + 1) / (len(inside) + 2)})
    return out


def confidence(table: Sequence[dict[str, Any]] | None, pick: Prediction) -> float:
    """The calibrated confidence of ``pick``: its (mode, score) bin's observed hit rate; 0.5 (no
    information) without a calibration."""
    if not table:
        return 0.5
    mode = "cross" if pick.cross_chip else "own"
    for row in table:
        upper = row["hi"] if row["hi"] < 1.0 else EDGES[-1]
        if row["mode"] == mode and row["lo"] <= pick.score < upper:
            return float(row["rate"])
    return 0.5
