"""The predictor as it was before it was batched (service/predict.py at 69c0205: one target at a
time, a Python loop over every source and config): the oracle that tests/service/test_predict_batched.py
compares :func:`kernelfleet.service.predict.predict_many` with. Not used by the service."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from kernelfleet.service.predict import (
    EVIDENCE_SCALE,
    MIN_COVERAGE,
    MIN_WEIGHT,
    NEAR,
    SHAPE_SCALE,
    TIE,
    Observations,
    Picks,
    Prediction,
    _more_bandwidth,
    _transfer,
    chip_similarity,
    parse_dims,
    work_per_thread,
)


def old_shape_distance(a: str, b: str) -> float | None:
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


def old_predict(
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
    min_weight: float = MIN_WEIGHT,
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
            distance = old_shape_distance(shape, s)
            if distance is None:
                continue
            distance += 0.0 if d == dtype else 1.0
            if other not in similar:
                similar[other] = chip_similarity(chip, other, observations)
            weight = similar[other] * math.exp(-distance / SHAPE_SCALE)
            if weight >= min_weight:  # (the parameter: not in the old code)
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
