"""Attribution: what changed between the last run before a change and the first run after it, and
the alert group key.

A cause is ``{attribute: [before, after]}`` for each attribute (MLX version, source revision, OS,
driver, kernel source hash, chosen config, worker) whose value differs between exactly those two
runs: the run just before the first slower run, and the first slower run. (Not the most common
value of the baseline: where every run has its own MLX version, only that pair names the upgrade
that did it.)

Regressions with the same environment-wide cause share one group key, so one cause that hits
several chips (or shapes) is one alert; a regression with no such cause is grouped per series. The
key names one change only: the first of :data:`SHARED_CAUSES` (MLX version pair, source revision
pair, OS pair, driver pair, the kernel's source change) that changed. An MLX upgrade that lands
together with an OS update on some chips (the common case on Macs) is then one group across all of
them, keyed by the MLX pair every chip shares; the other changes (``os: x -> y``) stay listed in
each regression's cause.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from kernelfleet.service.regressions.base import ATTRIBUTES, RunPoint

# attributes that change for a whole host or the whole fleet at once, so one cause may hit many chips;
# the first that changed keys the group (the most fleet-wide first)
SHARED_CAUSES = ("mlx_version", "revision", "os", "driver", "kernel_hash")
GROUP_KEY_MAX = 256
KNOWN_ONLY = ("worker", "revision")  # runs that did not say are not a change


def attribute(before: RunPoint, after: RunPoint) -> dict[str, list[str | None]]:
    """``{attribute: [value in before, value in after]}`` for every attribute recorded for both
    runs whose value differs."""
    cause: dict[str, list[str | None]] = {}
    for name in ATTRIBUTES:
        if name not in after.attrs or name not in before.attrs:
            continue
        old, new = before.attrs.get(name), after.attrs.get(name)
        if name in KNOWN_ONLY and (old is None or new is None):
            continue  # e.g. imported runs have no worker: unknown is not a change
        if new != old:
            cause[name] = [old, new]
    return cause


def group_key(
    kernel: str, series: tuple[str, str, str, str], cause: Mapping[str, Sequence[str | None]]
) -> str:
    """One key per cause: the first fleet-wide change of :data:`SHARED_CAUSES`, e.g.
    ``mlx_version=0.32.3->0.32.4`` whatever else changed at the same run (``kernel_hash=a->b;kernel=k``
    for a source change alone); per series (``series=chip|kernel|shape|dtype``) when nothing
    fleet-wide changed."""
    name = next((n for n in SHARED_CAUSES if n in cause), None)
    if name is not None:
        key = f"{name}={cause[name][0]}->{cause[name][1]}"
        if name == "kernel_hash":
            key += f";kernel={kernel}"
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
