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

A profile build predicts every (shape, dtype) of a kernel that the chip did not measure at once
(:func:`predict_many`; :func:`predict` is one target of it): the kernel's sources become a matrix of
times (sources x configs), each target's source weights a row of a (targets x sources) matrix
(distances on log dimensions, per rank), and the four sums of the vote matrix products. A build costs
O(targets x sources x configs) multiply-adds in numpy, not dict operations in Python (a chip's build
at 10,000 current series: see ``benchmarks/results/profile_build_growth.txt``). The products add in
another order than a loop over the sources did, so the rules compare rounded figures where float
order could decide a tie (:func:`predict_many`); on synthetic fleets the predictions equal the loop's
to 2e-14 relative (``tests/service/test_predict_batched.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

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


@lru_cache(maxsize=1 << 16)  # a pure function of the shape, asked for every source and target
def _log_dims(shape: str) -> tuple[float, ...] | None:
    """``(log numel, log d_1, log d_2, ...)``: what :func:`shape_distance` compares (every dimension
    after the first), or None for a shape that does not parse."""
    dims = parse_dims(shape)
    if dims is None:
        return None
    return (math.log(math.prod(dims)), *(math.log(d) for d in dims[1:]))


def shape_distance(a: str, b: str) -> float | None:
    la, lb = _log_dims(a), _log_dims(b)
    if la is None or lb is None or len(la) != len(lb):
        return None
    return float(_distance(np.array([la]), np.array([lb]))[0, 0])


def _distance(targets: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """Shape distances of every target to every source (rows of :func:`_log_dims`, one rank): the
    size term, then each later dimension's term, added in that order."""
    out = np.abs(targets[:, :1] - sources[:, 0])
    for i in range(1, targets.shape[1]):
        out += np.abs(targets[:, i:i + 1] - sources[:, i])
    return out


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
    :func:`predict_many` of one target.
    """
    return predict_many(chip, kernel, [(shape, dtype)], observations, valid=lambda _s, _d: valid,
                        exclude=exclude, picks=picks, similarity=similarity)[0]


@dataclass(frozen=True)
class _Sources:
    """One kernel's sources (every chip's measured (shape, dtype) of it), in the observations' order,
    with their configs' times as matrices (sources x configs; 0 where a source lacks a config)."""

    chips: list[str]
    shapes: list[str]
    dtypes: list[str]
    tables: list[dict[str, float]]
    keys: list[str]  # the configs' columns
    has: np.ndarray  # 1 where the source measured the config
    times: np.ndarray
    relative: np.ndarray  # time / the source's best
    far: np.ndarray  # 1 where the time is not within NEAR of the source's best
    numel: np.ndarray  # each source's element count


def _sources(kernel: str, observations: Observations,
             exclude: set[tuple[str, str, str, str]] | None) -> _Sources:
    chip_of, shapes, dtypes, tables = [], [], [], []
    for other, table in observations.items():
        for (k, s, d), times in table.items():
            if k != kernel or not times or (exclude and (other, k, s, d) in exclude) or _log_dims(s) is None:
                continue
            chip_of.append(other)
            shapes.append(s)
            dtypes.append(d)
            tables.append(times)
    column: dict[str, int] = {}
    cols: list[int] = []
    values: list[float] = []
    for times in tables:
        cols += [column.setdefault(key, len(column)) for key in times]
        values += times.values()
    rows = np.repeat(np.arange(len(tables)), [len(times) for times in tables])
    has = np.zeros((len(tables), len(column)))
    measured = np.zeros_like(has)
    has[rows, cols] = 1.0
    measured[rows, cols] = values
    best = np.array([min(times.values()) for times in tables]).reshape(-1, 1)
    return _Sources(chips=chip_of, shapes=shapes, dtypes=dtypes, tables=tables, keys=list(column), has=has,
                    times=measured, relative=measured / best, far=(measured > NEAR * best) * has,
                    numel=np.array([_numel(s) for s in shapes]))


@lru_cache(maxsize=1 << 16)
def _numel(shape: str) -> float:
    """The element count of a shape (1 for one that does not parse: it is never a source)."""
    return float(math.prod(parse_dims(shape) or (1,)))


def _weights(chip: str, targets: Sequence[tuple[str, str]], src: _Sources, similar: Mapping[str, float]
             ) -> np.ndarray:
    """Every target's weight of every source (targets x sources): chip similarity x exp(-shape
    distance / SHAPE_SCALE), 0 below MIN_WEIGHT (to 1e-9) and for another rank."""
    weights = np.zeros((len(targets), len(src.chips)))
    similarity = np.array([similar[c] for c in src.chips])
    dtypes = np.array(src.dtypes)
    by_rank: dict[int, tuple[list[int], list[int]]] = {}
    for i, s in enumerate(src.shapes):
        by_rank.setdefault(len(_log_dims(s) or ()), ([], []))[1].append(i)
    for j, (shape, _) in enumerate(targets):
        logs = _log_dims(shape)
        if logs is not None and len(logs) in by_rank:
            by_rank[len(logs)][0].append(j)
    for tj, si in by_rank.values():
        if not tj:
            continue
        distance = _distance(np.array([_log_dims(targets[j][0]) for j in tj]),
                             np.array([_log_dims(src.shapes[i]) for i in si]))
        distance += np.array([targets[j][1] for j in tj]).reshape(-1, 1) != dtypes[si]
        w = similarity[si] * np.exp(-distance / SHAPE_SCALE)
        # a source exactly at the cut counts (1000x the size, or 10x the size and 100x the row: its
        # float weight falls either side of 1e-6 by rounding alone)
        weights[np.ix_(tj, si)] = np.where(w >= MIN_WEIGHT * (1.0 - 1e-9), w, 0.0)
    return weights


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in one thread (numpy's own loop): OpenBLAS' threads, on 2 cores busy with requests,
    took 18-65 ms for a 40x210 @ 210x111 product that takes 0.1-0.6 ms in one."""
    return np.einsum("ts,sc->tc", a, b)


def predict_many(
    chip: str,
    kernel: str,
    targets: Sequence[tuple[str, str]],
    observations: Observations,
    *,
    valid: Callable[[str, str], Callable[[str], bool] | None] | None = None,
    exclude: set[tuple[str, str, str, str]] | None = None,
    picks: Picks | None = None,
    similarity: Mapping[str, float] | None = None,
) -> list[Prediction | None]:
    """:func:`predict` for every (shape, dtype) of ``targets`` at once (the same rules, one kernel):
    the sources' times become matrices and every target's sums over its sources matrix products, so
    a chip's build costs O(targets x sources) in numpy, not in Python. ``valid(shape, dtype)``: the
    target's ``valid`` of :func:`predict`. Sums run in another order than a loop over the sources
    would, so the rules compare rounded figures where float order could otherwise decide: the
    weight cut within 1e-9 of MIN_WEIGHT (a source mathematically at it counts), coverage within 1e-12
    of the half, mean relative times to 12 decimals (the near-best share to 9, as ever),
    the basis' and the heaviest source's weights to 12 (equal ones in source order).
    """
    out: list[Prediction | None] = [None] * len(targets)
    src = _sources(kernel, observations, exclude)
    if not src.chips or not targets:
        return out
    similar = dict(similarity or {})
    for other in dict.fromkeys(src.chips):
        if other not in similar:
            similar[other] = chip_similarity(chip, other, observations)
    weights = _weights(chip, targets, src, similar)
    at: dict[tuple[str, str], list[int]] = {}  # (shape, dtype) -> its sources
    for i, key in enumerate(zip(src.shapes, src.dtypes, strict=True)):
        at.setdefault(key, []).append(i)
    own = np.array([c == chip for c in src.chips])
    checks = [valid(shape, dtype) if valid else None for shape, dtype in targets]
    cross = np.ones(len(targets), dtype=bool)
    for j, (shape, dtype) in enumerate(targets):
        row = weights[j]
        for i in at.get((shape, dtype), ()):
            if own[i]:
                row[i] = 0.0  # that is the tuned entry itself, not a prediction
        cross[j] = not (row[own] > 0).any()
        exact = [i for i in at.get((shape, dtype), ()) if row[i] > 0]
        if cross[j] and exact:
            # another chip measured this very shape: that beats extrapolating from others
            out[j] = _transfer([(float(row[i]), src.chips[i], shape, dtype, src.tables[i]) for i in exact],
                               kernel, shape, dtype, checks[j], picks or {})
            keep = row[exact]
            row[:] = 0.0
            if out[j] is None:
                row[exact] = keep
    total = weights.sum(axis=1)
    ratio = np.array([_numel(s) for s, _ in targets]).reshape(-1, 1) / src.numel
    sum_w = _product(weights, src.has)
    sum_relative = _product(weights, src.relative)
    sum_scaled = _product(weights * ratio, src.times)
    sum_far = _product(weights, src.far)
    with np.errstate(divide="ignore", invalid="ignore"):  # a config no source of the target measured
        far_shares, mean_relative, mean_scaled = sum_far / sum_w, sum_relative / sum_w, sum_scaled / sum_w
    builtin = src.keys.index("builtin") if "builtin" in src.keys else None
    for j in map(int, np.flatnonzero(total > 0)):
        row, w, check = weights[j], sum_w[j], checks[j]
        covered = np.flatnonzero((w > 0) & (w >= MIN_COVERAGE * total[j] * (1.0 - 1e-12))).tolist()
        candidates = [c for c in covered if check is None or check(src.keys[c])]
        if not candidates:
            continue
        far_share, mean, scaled = far_shares[j].tolist(), mean_relative[j].tolist(), mean_scaled[j].tolist()
        share = {c: round(far_share[c], 9) for c in candidates}
        relative = {c: round(mean[c], 12) for c in candidates}
        choice = min(candidates, key=lambda c: (share[c], relative[c], src.keys[c]))
        if cross[j] and _more_bandwidth(
                chip, src.chips[int(np.flatnonzero(row >= row.max() * (1.0 - 1e-12))[0])]):  # first on a tie
            # Little's law: a chip with more bandwidth needs more bytes in flight to reach it, so among
            # the sources' ties it takes the config with the most work per thread (H100 -> H200: 6 of 8
            # misses of the plain tie-break were configs with less work per thread than the H200's best)
            limit = round(TIE * mean[choice], 12)
            ties = [c for c in candidates if share[c] == share[choice] and relative[c] <= limit]
            choice = max(ties, key=lambda c: (work_per_thread(src.keys[c]), -relative[c], src.keys[c]))
        expected = scaled[choice]
        speedup = (scaled[builtin] / expected if builtin is not None and w[builtin] > 0 and expected > 0
                   else None)
        used = np.flatnonzero(row > 0)
        share_of = row[used] / total[j]  # the heaviest first; weights equal to 12 decimals in source order
        basis = [{"chip": src.chips[i], "shape": src.shapes[i], "weight": round(float(row[i] / total[j]), 3)}
                 for i in used[np.argsort(-np.round(share_of, 12), kind="stable")][:3]]
        near_share = 1.0 - far_share[choice]
        nearest = float(row.max())
        out[j] = Prediction(config_key=src.keys[choice], median_us=expected, speedup=speedup,
                            score=near_share * nearest / (nearest + EVIDENCE_SCALE),
                            cross_chip=bool(cross[j]), basis=basis, near_share=near_share, nearest=nearest)
    return out


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
