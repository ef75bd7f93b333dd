"""Per-dtype tolerances for comparing golden outputs between chips.

A catalog kernel's own tolerance comes from ``kernelfleet.kernels.catalog.get_spec(name).tolerance(dtype)``
(the same bound its candidates must meet against the float32 reference). Results may also name
kernels the catalog doesn't have (imported reports, retired kernels); only those use
:data:`FALLBACK`, which mirrors the catalog's defaults for an output rounded once to the dtype.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

logger = logging.getLogger(__name__)

FALLBACK: dict[str, tuple[float, float]] = {  # dtype -> (atol, rtol)
    "float32": (2e-5, 2e-5),
    "float16": (2e-3, 4e-3),
    "bfloat16": (1.6e-2, 2e-2),
}
UNKNOWN_DTYPE = (1.6e-2, 2e-2)


@dataclass(frozen=True)
class Bound:
    atol: float
    rtol: float
    source: str  # "catalog" or "fallback"


@cache
def tolerance(kernel: str, dtype: str) -> Bound:
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import KernelError

        try:
            tol = get_spec(kernel).tolerance(dtype)
            return Bound(float(tol.atol), float(tol.rtol), "catalog")
        except (KernelError, KeyError):
            pass
    except ImportError:  # a coordinator without MLX installed
        logger.info("kernel catalog not importable; using fallback tolerances")
    atol, rtol = FALLBACK.get(dtype, UNKNOWN_DTYPE)
    return Bound(atol, rtol, "fallback")


@dataclass(frozen=True)
class Drift:
    """How far two golden samples are apart, in units of the tolerance (> 1: beyond it)."""

    comparable: bool
    identical: bool
    worst: float  # max over elements of |a - b| / (atol + rtol * max(|a|, |b|))
    max_abs: float
    reason: str = ""

    @property
    def beyond(self) -> bool:
        return self.comparable and not self.identical and self.worst > 1.0


def compare_golden(a: dict[str, Any], b: dict[str, Any], bound: Bound) -> Drift:
    if a.get("seed", 0) != b.get("seed", 0):  # stored with every result; older rows used seed 0
        return Drift(False, False, math.nan, math.nan, "runs used different input seeds")
    if a.get("digest") and a.get("digest") == b.get("digest"):
        return Drift(True, True, 0.0, 0.0)
    sa: Sequence[float] = a.get("sample") or []
    sb: Sequence[float] = b.get("sample") or []
    if a.get("numel") != b.get("numel") or a.get("stride") != b.get("stride") or len(sa) != len(sb) or not sa:
        return Drift(False, False, math.nan, math.nan, "samples differ in size or stride")
    worst = max_abs = 0.0
    for x, y in zip(sa, sb, strict=True):
        diff = abs(x - y)
        max_abs = max(max_abs, diff)
        worst = max(worst, diff / (bound.atol + bound.rtol * max(abs(x), abs(y))))
    return Drift(True, False, worst, max_abs)
