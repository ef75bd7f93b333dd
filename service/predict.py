"""Learned config predictions for (kernel, shape, dtype) never tuned on a chip.

The caller passes observations of **one backend** only (:mod:`kernelfleet.service.profiles` groups
them so): a Metal chip's prediction never cites a CUDA or CPU result.

Every measured (chip, shape, dtype) of a kernel is a *source*: its configs' times relative to its
best. A source's weight is how close it is to the target:

- shape distance (same rank only): ``|log(numel_a / numel_b)|``, how much more work one does, plus
  ``|log(a_i / b_i)|`` over every dimension after the first (row length, heads, experts: what the
  configs are built around), plus one for a different dtype; weight ``exp(-distance / SHAPE_SCALE)``.
  The total size decides most of a kernel's regime on a GPU (launch-bound, in L2, streaming from
  memory), so 2048x8192 is as close to 4096x4096 as the sizes say, not two factors of two away;
- chip similarity: 1 for the target chip itself; for another chip, how good that chip's choices
  are on the target where both measured the same (kernel, shape, dtype) (``exp(-mean log slowdown
  / 0.05)``), else the chip table's similarity (:mod:`kernelfleet.service.chips`: generation, cores,
  bandwidth), capped at ``OTHER_CHIP_CAP`` so the chip's own data leads. A chip the table cannot
  compare (another backend, an unknown name) contributes nothing.

Where the target chip measured nothing of the kernel and another chip of the family measured the very
(shape, dtype), that measurement alone decides: a *transfer*. With the source chips' measured picks
(``picks``: what their own profiles hold, the best same-run speedup over the built-in), the most
similar such chip's pick is the prediction (on the H100 -> H200 runs, the H100's own entry landed
within 5 % of the H200's tuned best on 21 of 25 custom entries, twice; a vote over the H100's per-config
times, with the tie-break below, on 12). Its score is how surely that decision stands on the source:
its margin ``m``, the low end of the pick's same-run speedup interval over the built-in (for the
built-in, the best config's slowdown at the high end of that config's interval), scored
``1 - m^(-1/0.15)`` (1.05 -> 0.28, 1.1 -> 0.47, 1.2 -> 0.70, 1.5 -> 0.93). A config that barely or
not surely beats the built-in on one chip is the pick most likely to lose to it, or to a neighbour,
on another: the four H100 entries that missed on the H200 beat the built-in by 1.07-1.10x on the
H100 (scores 0-0.27). Transfers are calibrated as a mode of their own. Without ``picks``, the
exact sources vote as below, and a chip with more bandwidth than its source breaks the sources'
near-ties (within ``TIE`` of the pick) by work per thread (``ipt x vec``): more bandwidth needs more
bytes in flight (Little's law).

The predicted config is the one most often near the best (within ``NEAR`` of a source's best time,
weighted) over the sources that measured it; ties go to the lower weighted mean relative time.
Only configs measured by at least half the total weight count (and only those valid for the target
shape, when the caller can tell). A vote is robust where a mean is not: one far source where a
config was 3x slower does not outweigh three near ones where it was best. Its expected time scales
each source's time by the element-count ratio (bandwidth-bound kernels); the speedup compares with
the built-in predicted the same way.

Any other prediction has a raw ``score`` in 0..1 (a transfer's is its margin's, above): the chosen
config's weighted near-best share (how consistently its sources found it within 5 % of their best),
times an evidence factor of the nearest source's weight (``w / (w + EVIDENCE_SCALE)``: a prediction
whose every source is far away, e.g. a 10x larger shape on another chip, scores near 0). On the
H100/H200 reports the near-best share separates hits from misses (held-out within-5 % rate 0.65 in
its lowest quartile, 0.94 in its highest) and, across chips, the nearest source's weight does (0.29
to 0.76). :mod:`kernelfleet.service.calibration` turns scores into a confidence measured on held-out
data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from kernelfleet.chips import lookup
from kernelfleet.service import chips

SHAPE_SCALE = 0.5
OTHER_CHIP_CAP = 0.8
EVIDENCE_SCALE = 0.002  # nearest-source weight at which the evidence factor of the score is 1/2
MIN_COVERAGE = 0.5
MIN_WEIGHT = 1e-6  # a source 1000x the size still counts, when nothing nearer was measured
NEAR = 1.05  # "near the best": within 5 % of a source's best time
TIE = 1.02  # cross-chip: configs within 2 % of the pick's mean relative time on the sources are ties
MORE_BANDWIDTH = 1.1  # a target chip with 10 % more bandwidth than its sources breaks ties by work per thread
TRANSFER_SCALE = 0.15  # a transfer's score: 1 - margin ** (-1 / TRANSFER_SCALE)

# (kernel, shape, dtype) -> {config_key: median time in microseconds}
ChipTable = dict[tuple[str, str, str], dict[str, float]]
# chip -> its table
Observations = Mapping[str, ChipTable]


@dataclass(frozen=True)
class SourcePick:
    """A chip's measured pick for one (kernel, shape, dtype): what its own profile holds."""

    config_key: str
    # how surely it beats the alternative there: for a config, the low end of its same-run speedup
    # interval over the built-in; for the built-in, the inverse of the best config's high end
    margin: float


# (chip, kernel, shape, dtype) -> that chip's measured pick
Picks = Mapping[tuple[str, str, str, str], SourcePick]


@dataclass(frozen=True)
class Prediction:
    config_key: str
    median_us: float
    speedup: float | None
    score: float  # raw, 0..1 (calibrated elsewhere): near-best share x evidence; a transfer's margin
    cross_chip: bool  # no source from the target chip itself
    transfer: bool = False  # another chip's measured pick at this very shape decided
    near_share: float = 0.0  # weighted share of its sources where the config was within NEAR of the best
    nearest: float = 0.0  # the heaviest single source's weight
    basis: list[dict[str, object]] = field(default_factory=list)  # the heaviest sources

    @property
    def mode(self) -> str:
        """The calibration mode: ``transfer``, ``cross`` (other chips, other shapes) or ``own``."""
        return "transfer" if self.transfer else "cross" if self.cross_chip else "own"


def transfer_score(margin: float) -> float:
    """0 for a decision on the edge (margin 1), towards 1 as the source's margin grows."""
    return 1.0 - margin ** (-1.0 / TRANSFER_SCALE) if margin > 1.0 else 0.0


def parse_dims(shape: str) -> tuple[int, ...] | None:
    try:
        dims = tuple(int(p) for p in shape.split("x"))
    except ValueError:
        return None
    return dims if dims and all(d > 0 for d in dims) else None


@lru_cache(maxsize=1 << 16)  # a pure function of two strings, asked for every (target, source) pair
def shape_distance(a: str, b: str) -> float | None:
    da, db = parse_dims(a), parse_dims(b)
    if da is None or db is None or len(da) != len(db):
        return None
    size = abs(math.log(math.prod(da) / math.prod(db)))
    return float(size + sum(abs(math.log(x / y)) for x, y in zip(da[1:], db[1:], strict=True)))


def numel_ratio(target: str, source: str) -> float:
    dt, ds = parse_dims(target), parse_dims(source)
    if dt is None or ds is None:
        return 1.0
    return math.prod(dt) / math.prod(ds)


def work_per_thread(config_key: str) -> int:
    """Elements one thread moves per step: the product of its items-per-thread and vector width."""
    out = 1
    for part in config_key.split(","):
        name, _, value = part.partition("=")
        if name in ("ipt", "vec") and value.isdigit():
            out *= int(value)
    return out


def _more_bandwidth(target: str, source: str) -> bool:
    a, b = lookup(target), lookup(source)
    return a is not None and b is not None and a.bandwidth_gbs > MORE_BANDWIDTH * b.bandwidth_gbs


def chip_similarity(target: str, other: str, observations: Observations) -> float:
    """1 for the same chip; otherwise how well ``other``'s best configs do on ``target``."""
    if target == other:
        return 1.0
    mine, theirs = observations.get(target, {}), observations.get(other, {})
    slowdowns = []
    for key in mine.keys() & theirs.keys():
        times, their_times = mine[key], theirs[key]
        their_best = min(their_times, key=their_times.__getitem__)
        if their_best in times:
            slowdowns.append(math.log(times[their_best] / min(times.values())))
    if slowdowns:
        return OTHER_CHIP_CAP * math.exp(-(sum(slowdowns) / len(slowdowns)) / 0.05)
    return OTHER_CHIP_CAP * chips.similarity(target, other)


def predict(
    chip: str,
    kernel: str,
    shape: str,
    dtype: str,
    observations: Observations,
    *,
    valid: Callable[[str], bool] | None = None,
    exclude: set[tuple[str, str, str, str]] | None = None,
    picks: Picks | None = None,
    similarity: Mapping[str, float] | None = None,
) -> Prediction | None:
    """The predicted config for ``kernel`` at ``shape``/``dtype`` on ``chip``, or None without sources.

    ``valid(config_key)`` rejects configs the kernel cannot run at ``shape``; ``exclude`` drops
    (chip, kernel, shape, dtype) sources (the held-out shape in the benchmark); ``picks``: the
    chips' measured picks, for transfers. ``similarity``: :func:`chip_similarity` of ``chip`` and
    each other chip over every kernel, when the caller computed it already (then ``observations``
    need hold only ``kernel``'s tables); chips it lacks are compared on ``observations``.
    """
    sources: list[tuple[float, str, str, str, dict[str, float]]] = []  # weight, chip, shape, dtype, times
    similar: dict[str, float] = dict(similarity or {})
    for other, table in observations.items():
        for (k, s, d), times in table.items():
            if k != kernel or not times or (exclude and (other, k, s, d) in exclude):
                continue
            if other == chip and s == shape and d == dtype:
                continue  # that is the tuned entry itself, not a prediction
            distance = shape_distance(shape, s)
            if distance is None:
                continue
            distance += 0.0 if d == dtype else 1.0
            if other not in similar:
                similar[other] = chip_similarity(chip, other, observations)
            weight = similar[other] * math.exp(-distance / SHAPE_SCALE)
            if weight >= MIN_WEIGHT:
                sources.append((weight, other, s, d, times))
    if not sources:
        return None
    cross_chip = all(c != chip for _, c, *_ in sources)
    exact = [src for src in sources if src[2] == shape and src[3] == dtype]
    if cross_chip and exact:
        sources = exact  # another chip measured this very shape: that beats extrapolating from others
        transfer = _transfer(sources, kernel, shape, dtype, valid, picks or {})
        if transfer is not None:
            return transfer
    total = sum(w for w, *_ in sources)
    # key -> [sum w*rel, sum w, sum w*scaled time, sum w*not near]
    scores: dict[str, list[float]] = {}
    for weight, _, s, _, times in sources:
        best = min(times.values())
        ratio = numel_ratio(shape, s)
        for key, t in times.items():
            acc = scores.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            acc[0] += weight * t / best
            acc[1] += weight
            acc[2] += weight * t * ratio
            acc[3] += weight * (t > NEAR * best)
    candidates = {
        k: v for k, v in scores.items() if v[1] >= MIN_COVERAGE * total and (valid is None or valid(k))
    }
    if not candidates:
        return None
    def share(k: str) -> float:
        return round(candidates[k][3] / candidates[k][1], 9)

    def relative(k: str) -> float:
        return candidates[k][0] / candidates[k][1]

    choice = min(candidates, key=lambda k: (share(k), relative(k), k))
    if cross_chip and _more_bandwidth(chip, max(sources, key=lambda x: x[0])[1]):
        # Little's law: a chip with more bandwidth needs more bytes in flight to reach it, so among the
        # sources' ties it takes the config with the most work per thread (H100 -> H200: 6 of 8 misses
        # of the plain tie-break were configs with less work per thread than the H200's best)
        ties = [k for k in candidates if share(k) == share(choice) and relative(k) <= TIE * relative(choice)]
        choice = max(ties, key=lambda k: (work_per_thread(k), -relative(k), k))
    acc = candidates[choice]
    expected = acc[2] / acc[1]
    builtin = scores.get("builtin")
    speedup = (builtin[2] / builtin[1]) / expected if builtin and expected > 0 else None
    basis = [
        {"chip": c, "shape": s, "weight": round(w / total, 3)}
        for w, c, s, _, _ in sorted(sources, key=lambda x: -x[0])[:3]
    ]
    near_share = 1.0 - acc[3] / acc[1]
    nearest = max(w for w, *_ in sources)
    score = near_share * nearest / (nearest + EVIDENCE_SCALE)
    return Prediction(config_key=choice, median_us=expected, speedup=speedup, score=score,
                      cross_chip=cross_chip, basis=basis,
                      near_share=near_share, nearest=nearest)


def _transfer(exact: list[tuple[float, str, str, str, dict[str, float]]], kernel: str, shape: str, dtype: str,
              valid: Callable[[str], bool] | None, picks: Picks) -> Prediction | None:
    """The most similar exact source's measured pick, or None when no exact source has a usable one."""
    total = sum(w for w, *_ in exact)
    for weight, other, _, _, times in sorted(exact, key=lambda x: (-x[0], x[1])):
        pick = picks.get((other, kernel, shape, dtype))
        if pick is None or pick.config_key not in times or (valid is not None and not valid(pick.config_key)):
            continue
        builtin = pick.config_key == "builtin"
        return Prediction(
            config_key=pick.config_key, median_us=times[pick.config_key],
            speedup=1.0 if builtin else pick.margin, score=transfer_score(pick.margin), cross_chip=True,
            transfer=True, near_share=1.0, nearest=weight,
            basis=[{"chip": other, "shape": shape, "weight": round(weight / total, 3)}])
    return None
