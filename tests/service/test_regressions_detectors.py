"""The detector core on synthetic runs (no database): the noise model, the step detector and its
confirmation rule, the change-point pass, attribution and grouping."""

from __future__ import annotations

import numpy as np

from kernelfleet.service.regressions import base
from kernelfleet.service.regressions.attribution import attribute, describe, group_key, reference_runs
from kernelfleet.service.regressions.base import RunPoint
from kernelfleet.service.regressions.noise import baseline

MIN_EFFECT = 0.03


def run(center: float, rng: np.random.Generator, spread: float = 0.02, **attrs: str) -> RunPoint:
    samples = center * np.exp(rng.normal(0, spread, 50))
    return RunPoint(
        median_us=float(np.median(samples)),
        samples_us=tuple(samples),
        n=50,
        attrs={"mlx_version": "0.32.3", "os": "macOS 15.1", "worker": "w1", **attrs},
    )


def series(levels: list[float], seed: int = 0, run_sigma: float = 0.01) -> list[RunPoint]:
    rng = np.random.default_rng(seed)
    return [run(level * float(np.exp(rng.normal(0, run_sigma))), rng) for level in levels]


def test_noise_model_counts_run_to_run_variance() -> None:
    tight = series([100.0] * 12, run_sigma=0.0)
    loose = series([100.0] * 12, run_sigma=0.05)
    assert baseline(loose).scale > 3 * baseline(tight).scale
    # within-run spread alone floors the scale: 2 % samples, 50 per run
    assert 0.001 < baseline(tight).scale < 0.01
    # a 6 % slower run is far out for a steady series, not significant (alpha 1e-3) for a noisy one
    slower = np.log(106.0)
    assert baseline(tight).p_slower(slower) < 1e-4 < 1e-3 < baseline(loose).p_slower(slower)


def test_step_detector_flags_a_step_and_not_noise_or_small_effects() -> None:
    step = base.online("step")
    history = series([100.0] * 10)
    rng = np.random.default_rng(9)
    finding = step.check(history, run(115.0, rng), MIN_EFFECT)
    assert finding is not None and 0.1 < finding.effect < 0.2 and finding.p_value < 1e-3
    assert step.check(history, run(101.0, rng), MIN_EFFECT) is None
    assert step.check(history, run(102.0, rng, spread=0.001), MIN_EFFECT) is None  # below the minimum effect
    assert step.check(history[:3], run(150.0, rng), MIN_EFFECT) is None  # too little history


def test_confirmation_rule_reproduces_steps_and_dismisses_spikes() -> None:
    step = base.online("step")
    history = series([100.0] * 10, seed=1)
    rng = np.random.default_rng(2)
    suspect = step.check(history, run(160.0, rng), MIN_EFFECT)
    assert suspect is not None
    assert step.confirms(history, suspect, run(158.0, rng), MIN_EFFECT)  # the re-run is slow too
    assert not step.confirms(history, suspect, run(100.5, rng), MIN_EFFECT)  # it was a one-off
    assert not step.confirms(history, suspect, run(104.0, rng), MIN_EFFECT)  # less than half the effect


def test_changepoint_finds_drift_and_ignores_noise_and_spikes() -> None:
    scan = base.offline("changepoint")
    drift = series([100.0] * 20 + [100.0 * (1 + 0.01 * i) for i in range(1, 16)] + [115.0] * 15, seed=3)
    [found] = scan.scan(drift, MIN_EFFECT)
    assert 20 <= found.index <= 35 and found.effect > 0.08
    assert scan.scan(series([100.0] * 50, seed=4), MIN_EFFECT) == []
    spiky = series([100.0] * 50, seed=5)
    spiky[25] = run(180.0, np.random.default_rng(6))
    assert scan.scan(spiky, MIN_EFFECT) == []
    faster = series([100.0] * 25 + [80.0] * 25, seed=7)
    assert scan.scan(faster, MIN_EFFECT) == []  # an improvement is not a regression
    assert scan.scan(drift[:8], MIN_EFFECT) == []  # too short to split


def test_attribution_and_group_keys() -> None:
    rng = np.random.default_rng(8)
    history = [run(100.0, rng) for _ in range(8)]
    new = run(120.0, rng, mlx_version="0.32.4")
    cause = attribute(reference_runs(history, MIN_EFFECT), new)
    assert cause == {"mlx_version": ["0.32.3", "0.32.4"]}
    assert describe(cause) == "mlx_version: 0.32.3 -> 0.32.4"
    # the same cause on two chips is one group; an unexplained slowdown is grouped per series
    k1 = group_key("rmsnorm", ("Apple M3", "rmsnorm", "4096x4096", "float16"), cause)
    k2 = group_key("rmsnorm", ("Apple M4", "rmsnorm", "1x4096", "float16"), cause)
    assert k1 == k2 == "mlx_version=0.32.3->0.32.4"
    k3 = group_key("rmsnorm", ("Apple M3", "rmsnorm", "4096x4096", "float16"), {})
    assert (
        k3 == "series=Apple M3|rmsnorm|4096x4096|float16" and len(group_key("k", ("x" * 300,) * 4, {})) <= 256
    )
    # a kernel source change groups per kernel; an unknown worker is not a change
    src = group_key("softmax", ("c", "softmax", "s", "d"), {"kernel_hash": ["a", "b"]})
    assert src == "kernel_hash=a->b;kernel=softmax"
    unknown = RunPoint(median_us=120.0, attrs={"mlx_version": "0.32.3", "os": "macOS 15.1", "worker": None})
    assert attribute(history, unknown) == {}
    # the last runs still at the baseline level are the reference, not the slow ones caught late
    late = history + [run(120.0, rng, mlx_version="0.32.4") for _ in range(2)]
    assert attribute(reference_runs(late, MIN_EFFECT), new) == {"mlx_version": ["0.32.3", "0.32.4"]}
