"""Measurement: real MLX execution on the CPU, with a tiny spec whose candidates are plain MLX
compositions (MLX has no custom CPU kernels), including a broken, a crashing and a wrong one."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.kernels.spec import BUILTIN, KernelBuildError, KernelSpec, Tolerance, config_key
from kernelfleet.worker.backends.base import Backend
from kernelfleet.worker.golden import golden
from kernelfleet.worker.measure import AllCandidatesFailed, Measurer

CALLS: list[str] = []


def _make_inputs(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return [mx.array(rng.standard_normal(shape).astype(np.float32)).astype(getattr(mx, dtype))]


def _build(config, backend, shape, dtype):
    v = config["v"]
    if v == "broken":
        raise KernelBuildError("error: expected ';' after expression")
    if v == "wrong":
        return lambda xs: [xs[0] * 3]
    if v == "crash":
        def crash(xs):
            raise RuntimeError("invalid launch configuration")
        return crash
    n = int(v)

    def fn(xs):
        CALLS.append(config["v"])
        return [sum([xs[0]] * n) * (2.0 / n)]  # n adds: more work for larger n, same result
    return fn


def tiny_spec(variants=("1", "2", "4", "broken", "wrong", "crash")) -> KernelSpec:
    return KernelSpec(
        name="double", description="y = 2x", dtypes=("float32", "float16"), shape_doc="rows x cols",
        shapes={"decode": [(1, 64)], "large": [(256, 256)]}, make_inputs=_make_inputs,
        reference=lambda xs: [xs[0].astype(mx.float32) * 2], builtin=lambda xs: [xs[0] * 2],
        space=lambda s, d: [{"v": v} for v in variants], build=_build,
        tolerances={"float32": Tolerance(1e-5, 1e-5), "float16": Tolerance(1e-2, 1e-2)},
        bytes_moved=lambda s, d: 2 * s[0] * s[1] * 2, version="test-1")


class Composed(Backend):
    """A CPU backend that accepts custom candidates (the tiny spec's are MLX compositions)."""

    name = "cpu"
    supports_custom_kernels = True

    @property
    def kernel_backend(self) -> str:
        # the spec's custom candidates are MLX compositions: offer them as a GPU backend would
        return "cuda"

    def available(self) -> bool:
        return True

    @property
    def device(self) -> mx.Device:
        return mx.Device(mx.cpu)

    def build(self, spec, config, shape, dtype):
        # Plain calls, not compiled graphs: these tests count each call's Python side effect (CALLS),
        # which a replayed graph would not repeat.
        if config_key(config) == "builtin":
            return spec.builtin
        return spec.build(config, self.name, shape, dtype)


def measurer(spec: KernelSpec, shape=(16, 128), dtype="float16", seed=0, **kw) -> Measurer:
    be = Composed()
    inputs = spec.make_inputs(shape, dtype, seed)
    ref = spec.reference(inputs)
    return Measurer(spec, be, shape, dtype, inputs, ref, be.candidates(spec, shape, dtype), seed=seed, **kw)


def test_failures_are_classified_and_kept():
    m = measurer(tiny_spec())
    keys = list(m.trials)
    medians = m.measure(keys, 4)
    t = m.trials
    assert [t[k].status for k in keys] == ["ok", "ok", "ok", "ok", "compile_error", "mismatch",
                                           "launch_error"]
    assert "expected ';'" in t["v=broken"].error
    assert "invalid launch configuration" in t["v=crash"].error and "RuntimeError" in t["v=crash"].error
    assert "outside tolerance" in t["v=wrong"].error
    assert t["v=wrong"].max_abs_err > 0.5  # 3x vs 2x: the error was measured and recorded
    for k in ("v=broken", "v=wrong", "v=crash"):
        rep = t[k].to_report()
        assert medians[k] is None and rep["n"] == 0 and rep["samples_us"] is None
        assert rep["median_us"] is rep["p10_us"] is rep["p90_us"] is None
    assert len(m.touched()) == 7


def test_samples_and_stats():
    m = measurer(tiny_spec())
    m.measure(list(m.trials), 5)
    m.measure(["builtin", "v=1"], 3)
    for key, rounds in (("builtin", 8), ("v=1", 8), ("v=2", 5), ("v=4", 5)):
        rep = m.trials[key].to_report()
        assert rep["n"] == rounds == len(rep["samples_us"])
        assert rep["median_us"] == pytest.approx(float(np.median(rep["samples_us"])))
        assert rep["p10_us"] <= rep["median_us"] <= rep["p90_us"]
        assert all(s > 0 for s in rep["samples_us"])
        assert rep["max_abs_err"] is not None and rep["max_abs_err"] <= 1e-2
    # a decode-size launch is far below 1 ms, so a round batches many launches between syncs
    assert m.trials["builtin"].launches_per_round > 1
    # the calibration timing is kept apart from the samples, and counts for screening only
    seen = m.best_seen(list(m.trials))
    for key in ("builtin", "v=1", "v=2", "v=4"):
        trial = m.trials[key]
        assert trial.calibration_us is not None and trial.calibration_us > 0
        assert seen[key] == min([*trial.samples_us, trial.calibration_us])
        assert m.samples(key) == trial.samples_us
    assert seen["v=wrong"] is None and m.samples("v=wrong") == []


def test_rounds_interleave_candidates_in_seeded_shuffled_order():
    def orders(seed):
        spec = tiny_spec(("1", "2", "4"))
        m = measurer(spec, seed=seed, min_round_s=0.0)  # one launch per round: each call = one round slot
        m.prepare(list(m.trials))
        CALLS.clear()
        m.measure(["v=1", "v=2", "v=4"], 12)
        rounds = [CALLS[i:i + 3] for i in range(0, len(CALLS), 3)]
        assert len(rounds) == 12 and all(sorted(r) == ["1", "2", "4"] for r in rounds)
        return rounds

    a, b, c = orders(0), orders(0), orders(1)
    assert a == b  # seeded
    assert len({tuple(r) for r in a}) > 1  # shuffled round by round, not a fixed order
    assert a != c


def test_all_failed_is_an_error():
    m = measurer(tiny_spec(("broken", "wrong")))
    m.trials.pop("builtin")
    m.measure(list(m.trials), 2)
    with pytest.raises(AllCandidatesFailed, match="all 2 candidates failed.*v=broken: compile_error"):
        m.raise_if_all_failed()


def test_golden():
    x = mx.arange(1000, dtype=mx.float16) / 10
    g = golden([x])
    flat = np.asarray((mx.arange(1000, dtype=mx.float16) / 10).astype(mx.float32))
    assert g["digest"] == hashlib.sha256(flat.astype("<f4").tobytes()).hexdigest()
    assert g["numel"] == 1000 and g["stride"] == 4 and len(g["sample"]) == 250
    assert g["sample"][:3] == [float(flat[0]), float(flat[4]), float(flat[8])]
    assert g["stats"]["max"] == pytest.approx(99.9, abs=0.05) and g["stats"]["min"] == 0.0
    two = golden([x, mx.ones((3,))])
    assert two["numel"] == 1003 and two["digest"] != g["digest"]
    assert golden([mx.zeros((5,))])["stride"] == 1
    rnd = random.Random(0)
    big = mx.array([rnd.random() for _ in range(100_000)])
    assert len(golden([big])["sample"]) == 256


def test_golden_stats_over_chunks_match_a_float64_copy() -> None:
    """The chunked one-pass statistics agree with numpy over a float64 copy of the whole output
    (an offset mean, so a one-pass variance would show any cancellation)."""
    from kernelfleet.worker import golden as G

    rng = np.random.default_rng(3)
    flat = (rng.standard_normal(3 * G.STATS_CHUNK + 12345, dtype=np.float32) * 2.5 + 7.0).astype(np.float32)
    x = flat.astype(np.float64)
    got = G.stats(flat)
    assert got["mean"] == pytest.approx(float(x.mean()), rel=1e-12)
    assert got["std"] == pytest.approx(float(x.std()), rel=1e-9)
    assert got["abs_mean"] == pytest.approx(float(np.abs(x).mean()), rel=1e-12)
    assert (got["min"], got["max"]) == (float(x.min()), float(x.max()))


def _slow_start_spec(slow_calls: int = 4) -> KernelSpec:
    """The tiny spec with one custom candidate whose first ``slow_calls`` launches each take 5 ms
    more (a one-time cost, as a first allocation might; four: the correctness check, the warm-up
    and the calibration's first pass of two)."""
    def build(config, backend, shape, dtype):
        calls = 0

        def fn(xs):
            nonlocal calls
            calls += 1
            if calls <= slow_calls:
                time.sleep(0.005)
            return [xs[0] * 2]
        return fn
    return dataclasses.replace(tiny_spec(("1",)), build=build)


@pytest.mark.parametrize("check_rounds", [0, 3])
def test_calibration_checks_that_a_round_is_long_enough(check_rounds):
    m = measurer(_slow_start_spec(), check_rounds=check_rounds)
    m.prepare(["v=1"])
    trial = m.trials["v=1"]
    if check_rounds == 0:
        # read from the first pass alone (5 ms a launch), a round would be one launch: the fixed
        # start-and-drain cost of every round lands on that one launch
        assert trial.launches_per_round == 1
    else:
        # a full round of K launches was timed, far short of 4 ms, and K scaled up from it
        assert trial.launches_per_round > 1
        assert trial.calibration_us < 5000


def test_a_round_far_too_short_resizes_the_rounds_after_it():
    # slow through the calibration and its one-launch check round (five calls), fast from the first
    # timed round: K stays 1 through the calibration, and the first timed round resizes it
    m = measurer(_slow_start_spec(slow_calls=5), check_rounds=1)
    m.prepare(["v=1"])
    assert m.trials["v=1"].launches_per_round == 1
    m.measure(["v=1"], 3)
    trial = m.trials["v=1"]
    assert trial.launches_per_round > 1 and trial.resized >= 1
    assert len(trial.samples_us) == 3  # the short round's sample is kept


class RenderedOnMetal(Composed):
    """Offers a real catalog spec's Metal configs (their identity: the kernels they render for Metal)
    and runs each as the spec's built-in on the CPU, counting the builds."""

    @property
    def kernel_backend(self) -> str:
        return "metal"

    def __init__(self) -> None:
        self.built: list[str] = []

    def build(self, spec, config, shape, dtype):
        self.built.append(config_key(config))
        return spec.builtin


def test_identical_kernels_are_measured_once_and_every_config_keeps_its_row():
    from kernelfleet.kernels.catalog import get_spec

    spec = get_spec("rmsnorm")
    shape, dtype = spec.test_shapes[0], "float32"
    plain = {"tg": 32, "vec": 4, "rpg": 1}
    configs = [dict(BUILTIN), plain, {**plain, "hint": 1}, {**plain, "hint": 2},
               {"tg": 64, "vec": 4, "rpg": 1}]
    be = RenderedOnMetal()
    inputs = spec.make_inputs(shape, dtype, 0)
    m = Measurer(spec, be, shape, dtype, inputs, spec.reference(inputs), configs, seed=0, min_round_s=1e-4)
    keys = list(m.trials)
    # the hint renders identical Metal source: one identity for the three
    ids = {k: be.kernel_identity(spec, m.trials[k].config, shape, dtype, inputs) for k in keys}
    assert ids["builtin"] is None
    assert ids[keys[1]] == ids[keys[2]] == ids[keys[3]] != ids[keys[4]]
    medians = m.measure(keys, 3)
    assert be.built == ["builtin", keys[1], keys[4]]  # each distinct kernel built, checked and timed once
    rows = {t.key: t.to_report() for t in m.touched()}
    assert list(rows) == keys  # ... and every config still has its row
    for k in keys[2:4]:
        assert rows[k]["shares_measurement_with"] == keys[1]
        assert rows[k]["status"] == "ok" and rows[k]["samples_us"] == rows[keys[1]]["samples_us"]
        assert medians[k] == medians[keys[1]]
    assert "shares_measurement_with" not in rows[keys[1]]
    assert "shares_measurement_with" not in rows[keys[4]]
    assert rows[keys[1]]["n"] == 3  # three rounds, not nine: the shared kernel ran once a round
    from kernelfleet.service.schemas import ReportTrial  # the coordinator takes the marked rows

    assert ReportTrial.model_validate(rows[keys[2]]).shares_measurement_with == keys[1]
    # a search that keeps only a sharer still times the kernel (through the candidate measured)
    m.measure([keys[3]], 2)
    assert rows[keys[1]]["n"] + 2 == m.trials[keys[3]].to_report()["n"] == 5
