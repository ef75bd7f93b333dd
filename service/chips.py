"""How similar two chips are: what predictions across chips may lean on.

Predictions cross chips only within one backend family (Metal with Metal, CUDA with CUDA; CPU
never predicts a custom config). Within a family, chips are compared on the three published figures
of the chip table (:mod:`kernelfleet.chips`):

- **generation** (Apple M1..M4; NVIDIA compute capability 8.0, 8.9, 9.0, 10.0): instruction set,
  SIMD-group/warp features and cache design, which decide which code shape wins;
- **GPU cores** (Apple GPU cores; NVIDIA SMs): how many groups run at once, which decides
  threadgroup sizes and rows per group;
- **memory bandwidth** (GB/s): where a shape turns from launch-bound to bandwidth-bound, which
  decides vector width and work per thread.

``similarity = exp(-(GEN * |Δgeneration| + CORES * |log cores ratio| + BW * |log bandwidth ratio|))``.
A chip not in the table is only similar to itself.
"""

from __future__ import annotations

import math

from kernelfleet.chips import lookup

GEN_WEIGHT = 0.7
CORES_WEIGHT = 0.5
BW_WEIGHT = 0.8


def distance(a: str, b: str) -> float | None:
    """The weighted distance between two chips of one family; 0 for the same name; None when a chip
    is not in the table or the two are of different backends."""
    if a == b:
        return 0.0
    ca, cb = lookup(a), lookup(b)
    if ca is None or cb is None or ca.backend != cb.backend:
        return None
    return (GEN_WEIGHT * abs(ca.generation - cb.generation)
            + CORES_WEIGHT * abs(math.log(ca.cores / cb.cores))
            + BW_WEIGHT * abs(math.log(ca.bandwidth_gbs / cb.bandwidth_gbs)))


def similarity(a: str, b: str) -> float:
    """exp(-distance): 1 for the same chip, 0 when the chips cannot be compared."""
    d = distance(a, b)
    return 0.0 if d is None else math.exp(-d)


def closest(target: str, candidates: list[str], n: int = 3) -> list[str]:
    """The ``n`` candidates most similar to ``target`` (comparable ones first, then by name)."""
    return sorted(candidates, key=lambda c: (-similarity(target, c), c))[:n]
