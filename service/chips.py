"""The chip table: what predictions across chips may lean on, and how similar two chips are.

Predictions cross chips only within one backend family (Metal with Metal, CUDA with CUDA; CPU
never predicts a custom config). Within a family, chips are compared on three published figures:

- **generation** (Apple M1..M4; NVIDIA compute capability 8.0, 8.9, 9.0, 10.0): instruction set,
  SIMD-group/warp features and cache design, which decide which code shape wins;
- **GPU cores** (Apple GPU cores; NVIDIA SMs): how many groups run at once, which decides
  threadgroup sizes and rows per group;
- **memory bandwidth** (GB/s): where a shape turns from launch-bound to bandwidth-bound, which
  decides vector width and work per thread.

``similarity = exp(-(GEN * |Δgeneration| + CORES * |log cores ratio| + BW * |log bandwidth ratio|))``.
A chip not in the table is matched by its name (family and variant for Apple chips); without a
match it is only similar to itself. Figures: Apple's and NVIDIA's published specifications.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GEN_WEIGHT = 0.7
CORES_WEIGHT = 0.5
BW_WEIGHT = 0.8


@dataclass(frozen=True)
class Chip:
    name: str
    backend: str  # metal | cuda
    generation: float
    cores: int
    bandwidth_gbs: float


def _apple(family: int, variant: str, cores: int, bw: float) -> Chip:
    name = f"Apple M{family}" + (f" {variant}" if variant else "")
    return Chip(name, "metal", float(family), cores, bw)


# Apple silicon: the largest GPU configuration of each chip (binned parts have fewer cores)
TABLE: tuple[Chip, ...] = (
    _apple(1, "", 8, 68), _apple(1, "Pro", 16, 200), _apple(1, "Max", 32, 400), _apple(1, "Ultra", 64, 800),
    _apple(2, "", 10, 100), _apple(2, "Pro", 19, 200), _apple(2, "Max", 38, 400), _apple(2, "Ultra", 76, 800),
    _apple(3, "", 10, 100), _apple(3, "Pro", 18, 150), _apple(3, "Max", 40, 400), _apple(3, "Ultra", 80, 819),
    _apple(4, "", 10, 120), _apple(4, "Pro", 20, 273), _apple(4, "Max", 40, 546),
    Chip("NVIDIA A100 40GB", "cuda", 8.0, 108, 1555),
    Chip("NVIDIA A100 80GB", "cuda", 8.0, 108, 2039),
    Chip("NVIDIA L4", "cuda", 8.9, 58, 300),
    Chip("NVIDIA L40S", "cuda", 8.9, 142, 864),
    Chip("NVIDIA GeForce RTX 4090", "cuda", 8.9, 128, 1008),
    Chip("NVIDIA H100 PCIe", "cuda", 9.0, 114, 2000),
    Chip("NVIDIA H100 80GB HBM3", "cuda", 9.0, 132, 3350),  # SXM
    Chip("NVIDIA H200", "cuda", 9.0, 132, 4800),
    Chip("NVIDIA GH200", "cuda", 9.0, 132, 4000),
    Chip("NVIDIA B200", "cuda", 10.0, 148, 8000),
)
_BY_NAME = {c.name.casefold(): c for c in TABLE}
_APPLE_RE = re.compile(r"\bM(\d+)(?:\s+(Pro|Max|Ultra))?\b", re.IGNORECASE)


def lookup(name: str) -> Chip | None:
    """The table row for a chip name as workers report it ("Apple M3 Max", "NVIDIA H100 80GB HBM3")."""
    key = name.strip().casefold()
    if key in _BY_NAME:
        return _BY_NAME[key]
    m = _APPLE_RE.search(name)
    if name.lower().startswith("apple") and m:
        variant = (m.group(2) or "").capitalize()
        return _BY_NAME.get((f"Apple M{m.group(1)}" + (f" {variant}" if variant else "")).casefold())
    for row in TABLE:  # "NVIDIA H200 NVL" -> "NVIDIA H200": the longest table name it starts with
        if row.backend == "cuda" and key.startswith(row.name.casefold()):
            return row
    return None


def backend_of(name: str) -> str | None:
    """The backend a chip's profile is for, from the table or its vendor prefix; None when unknown."""
    row = lookup(name)
    if row is not None:
        return row.backend
    low = name.strip().lower()
    if low.startswith("apple"):
        return "metal"
    if low.startswith("nvidia"):
        return "cuda"
    return None


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
