"""The paired verdict on two sides timed by turns, round by round: one side's speed over the other's
from each round's own pair, with its 95 % bootstrap interval (:func:`paired_speedup`), and what the
interval says (:func:`verdict`). ``benchmarks/model.py`` and the runtime-settings search
(``kernelfleet.worker.runtime_settings``) decide with it. Imports only numpy.
"""

from __future__ import annotations

BOOTSTRAP = 2000


def paired_speedup(stock: list[float], patched: list[float]) -> tuple[float, float, float]:
    """Patched over stock speed from each round's own pair (stock seconds / patched seconds: both ran
    back to back in that round, so drift between rounds cancels): the median of the rounds' ratios
    and its 95 % bootstrap interval (rounds resampled)."""
    import numpy as np

    ratios = np.asarray(stock) / np.asarray(patched)
    idx = np.random.default_rng(0).integers(0, len(ratios), size=(BOOTSTRAP, len(ratios)))
    lo, hi = np.percentile(np.median(ratios[idx], axis=1), [2.5, 97.5])
    return float(np.median(ratios)), float(lo), float(hi)


def verdict(lo: float, hi: float) -> str:
    return "faster" if lo > 1 else "slower" if hi < 1 else "within the noise"
