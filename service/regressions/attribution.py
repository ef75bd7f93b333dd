"""Attribution: what changed between the baseline runs and the new run, and the alert group key.

A cause is ``{attribute: [before, after]}`` for each attribute of the new run (MLX version, OS,
driver, kernel source hash, chosen config, worker) that differs from the value most of the
reference runs had: for a step, the last runs still at the baseline level
(:func:`reference_runs`); for a change point, the whole segment before it.

Regressions with the same environment-wide cause (MLX version, OS, driver, or the same kernel's
source change) share one group key, so one cause that hits several
chips (or shapes) is one alert; a regression with no such cause is grouped per series.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from kernelfleet.service.regressions.base import ATTRIBUTES, RunPoint

# attributes that change for a whole host or the whole fleet at once, so one cause may hit many chips
SHARED_CAUSES = ("mlx_version", "os", "driver", "kernel_hash")
GROUP_KEY_MAX = 256
KNOWN_ONLY = ("worker", "revision")  # runs that did not say are not a change


def reference_runs(history: Sequence[RunPoint], min_effect: float, last: int = 3) -> list[RunPoint]:
    """The latest ``last`` runs of ``history`` still at the baseline level (a step that the online
    detector caught a few runs late has slow runs at the end of its history: what changed is what
    differs from the runs before those)."""
    if not history:
        return []
    logs = np.array([p.log_median for p in history])
    cutoff = float(np.median(logs)) + float(np.log1p(min_effect / 2))
    normal = [p for p in history if p.log_median <= cutoff]
    return (normal or list(history))[-last:]


def attribute(baseline: Sequence[RunPoint], new: RunPoint) -> dict[str, list[str | None]]:
    """``{attribute: [baseline value, new value]}`` for every attribute whose value in ``new``
    differs from the one most of the baseline runs had."""
    recent = list(baseline)
    cause: dict[str, list[str | None]] = {}
    for name in ATTRIBUTES:
        if name not in new.attrs:
            continue
        values = Counter(p.attrs.get(name) for p in recent if name in p.attrs)
        if not values:
            continue
        before = values.most_common(1)[0][0]
        after = new.attrs.get(name)
        if name in KNOWN_ONLY and (before is None or after is None):
            continue  # e.g. imported runs have no worker: unknown is not a change
        if after != before:
            cause[name] = [before, after]
    return cause


def group_key(
    kernel: str, series: tuple[str, str, str, str], cause: Mapping[str, Sequence[str | None]]
) -> str:
    """One key per cause: ``mlx_version=0.32.3->0.32.4`` (plus the kernel for a source change);
    per series (``series=chip|kernel|shape|dtype``) when nothing fleet-wide changed."""
    shared = [f"{name}={cause[name][0]}->{cause[name][1]}" for name in SHARED_CAUSES if name in cause]
    if shared:
        if "kernel_hash" in cause:
            shared.append(f"kernel={kernel}")
        key = ";".join(shared)
    else:
        key = "series=" + "|".join(series)
    if len(key) > GROUP_KEY_MAX:
        key = key[: GROUP_KEY_MAX - 17] + "#" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return key


def describe(cause: Mapping[str, Sequence[str | None]]) -> str:
    """A one-line, human-readable account of a cause."""
    if not cause:
        return "nothing recorded changed (same MLX, OS, driver, kernel source, config and worker)"
    return ", ".join(f"{name}: {before} -> {after}" for name, (before, after) in cause.items())
