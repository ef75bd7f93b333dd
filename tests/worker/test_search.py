"""Search strategies as algorithms: a synthetic measurer over a known cost landscape (noise
included), so the tests can count exactly what each strategy measured."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

import pytest

from kernelfleet.worker.search import BUILTIN_KEY, Budget, UnknownStrategy, get_strategy, strategy_names
from kernelfleet.worker.search.base import SearchError
from kernelfleet.worker.search.halving import SuccessiveHalving
from kernelfleet.worker.search.random_search import RandomSearch


class Landscape:
    """A Measures implementation: each key has a true cost; each round samples it with noise."""

    def __init__(self, n: int, seed: int = 0, noise: float = 0.03, failing: int = 0) -> None:
        rng = random.Random(seed)
        self.keys = [BUILTIN_KEY] + [f"c={i}" for i in range(n)]
        # a bumpy landscape: a smooth bowl plus a per-candidate jitter, optimum somewhere inside
        centre = rng.uniform(0.2, 0.8) * n
        self.cost = {k: 50 + 30 * ((i - centre) / n) ** 2 + rng.uniform(0, 4)
                     for i, k in enumerate(self.keys)}
        self.cost[BUILTIN_KEY] = 60.0
        self.failed = set(rng.sample(self.keys[1:], failing))
        self.noise, self.rng = noise, random.Random(seed + 1)
        self.timed: dict[str, list[float]] = defaultdict(list)  # timed rounds per key
        self.calibration: dict[str, float] = {}  # one noisy timing at preparation, like Measurer's
        self.prepared: set[str] = set()
        self.stages: list[list[str]] = []  # keys of each measure() call that ran rounds

    def prepare(self, keys: Sequence[str]) -> None:
        for k in keys:
            if k not in self.prepared and k not in self.failed:
                self.calibration[k] = self.sample(k)
        self.prepared.update(keys)

    def sample(self, key: str) -> float:
        return self.cost[key] * (1 + self.rng.gauss(0, self.noise))

    def ok_keys(self, keys: Sequence[str] | None = None) -> list[str]:
        pool = keys if keys is not None else self.keys
        return [k for k in pool if k in self.prepared and k not in self.failed]

    def measure(self, keys: Sequence[str], rounds: int) -> dict[str, float | None]:
        self.prepare(keys)
        live = self.ok_keys(keys)
        if rounds:
            self.stages.append(live)
        for _ in range(rounds):
            for k in live:
                self.timed[k].append(self.sample(k))
        return {k: (sorted(self.timed[k])[len(self.timed[k]) // 2] if self.timed[k] else None)
                if k not in self.failed else None for k in keys}

    def best_seen(self, keys: Sequence[str]) -> dict[str, float | None]:
        return {k: min(self.timed[k] + [self.calibration[k]]) if k in self.calibration else None
                for k in keys}

    def samples(self, key: str) -> list[float]:
        return list(self.timed.get(key, [])) if key not in self.failed else []

    def rounds_used(self) -> int:
        return sum(len(v) for v in self.timed.values())

    def true_best(self) -> str:
        return min((c, k) for k, c in self.cost.items() if k not in self.failed)[1]


class CountingBudget(Budget):
    """Exhausted after a fixed number of checks (no clocks in tests)."""

    def __init__(self, checks_before_exhausted: int) -> None:
        super().__init__(1.0)
        self.left = checks_before_exhausted

    def exhausted(self) -> bool:
        self.left -= 1
        return self.left < 0


def run(name: str, land: Landscape, budget: Budget | None = None) -> str | None:
    return get_strategy(name).search(land.keys, land, budget or Budget(), random.Random(0))


def test_registry():
    assert strategy_names() == ["halving", "exhaustive", "random", "model"]
    with pytest.raises(UnknownStrategy, match="choose one of: halving, exhaustive, random, model"):
        get_strategy("annealing")
    with pytest.raises(SearchError, match="positive number of seconds"):
        Budget(0)


def test_exhaustive_measures_everything_equally():
    land = Landscape(40, failing=3)
    best = run("exhaustive", land)
    assert best == land.true_best()
    counts = {k: len(v) for k, v in land.timed.items()}
    assert set(counts) == set(land.ok_keys()) and set(counts.values()) == {30}


@pytest.mark.parametrize("seed", range(6))
def test_halving_finds_the_best_cheaply(seed):
    ex, hv = Landscape(120, seed=seed), Landscape(120, seed=seed)
    best_ex, best_hv = run("exhaustive", ex), run("halving", hv)
    # within 3% of exhaustive's best at <= 30% of its candidate-rounds
    assert hv.cost[best_hv] <= 1.03 * ex.cost[best_ex]
    assert hv.rounds_used() <= 0.30 * ex.rounds_used()
    # screening touched everything; the built-in took part in every stage
    assert hv.prepared == set(hv.keys)
    assert all(BUILTIN_KEY in stage for stage in hv.stages)
    # the planned step count (for progress bars) bounds what ran (racing may end finalists early)
    assert get_strategy("halving").planned_steps(121) >= 121 + hv.rounds_used()


def test_halving_final_stage_is_precise_and_never_worse_than_builtin():
    land = Landscape(30, seed=3)
    land.cost = {k: 100.0 for k in land.keys}
    land.cost[BUILTIN_KEY] = 10.0  # the built-in is the fastest: it must win
    assert run("halving", land) == BUILTIN_KEY
    assert len(land.timed[BUILTIN_KEY]) == 30
    finalists = land.stages[-1]
    assert len(finalists) <= SuccessiveHalving().finalists + 1


def test_halving_final_races_clearly_slower_finalists_out():
    land = Landscape(30, seed=4, noise=0.01)
    land.cost = {k: 100.0 + 10 * i for i, k in enumerate(land.keys)}  # c=0 fastest, 10% steps
    land.cost[BUILTIN_KEY] = 200.0
    hv = SuccessiveHalving()
    assert run("halving", land) == "c=0"
    # the leader and the built-in ran the whole final; the other finalists stopped at race_from
    assert len(land.timed["c=0"]) == len(land.timed[BUILTIN_KEY]) == hv.final_rounds
    others = [k for k in land.stages[-2] if k not in ("c=0", BUILTIN_KEY)]
    assert others and all(len(land.timed[k]) == hv.race_from for k in others)
    # a tie is never raced out: every finalist runs the full final
    tie = Landscape(30, seed=4, noise=0.03)
    tie.cost = {k: 100.0 for k in tie.keys}
    run("halving", tie)
    assert all(len(tie.timed[k]) == hv.final_rounds for k in tie.stages[-1])
    assert len(tie.stages[-1]) == hv.finalists + 1


def test_halving_with_every_custom_failing_measures_builtin():
    land = Landscape(10, failing=10)
    assert run("halving", land) == BUILTIN_KEY
    assert len(land.timed[BUILTIN_KEY]) == 30


def test_halving_budget_cuts_to_a_short_final():
    land = Landscape(200, seed=1)
    best = run("halving", land, CountingBudget(0))
    hv = SuccessiveHalving()
    assert len(land.stages) == 2  # screening, then straight to a short final
    assert len(land.stages[1]) == hv.finalists + 1 and BUILTIN_KEY in land.stages[1]
    assert len(land.timed[best]) == 2 * hv.screen_rounds


def test_exhaustive_budget_keeps_min_rounds_for_everyone():
    land = Landscape(20)
    run("exhaustive", land, CountingBudget(0))
    assert {len(v) for v in land.timed.values()} == {3}


def test_random_samples_a_fraction_and_respects_budget():
    land = Landscape(100, seed=2)
    best = run("random", land)
    r = RandomSearch()
    measured = set(land.timed)
    assert BUILTIN_KEY in measured and len(measured) == 1 + r.sample_size(100) == 26
    assert land.cost[best] <= 1.03 * min(land.cost[k] for k in measured)
    small = Landscape(100, seed=2)
    run("random", small, CountingBudget(0))  # budget spent after the first batch
    assert len(small.timed) == 1 + r.batch
    assert {len(v) for v in small.timed.values()} == {r.min_rounds}
    # seeded: the same sample twice
    again = Landscape(100, seed=2)
    run("random", again)
    assert set(again.timed) == measured


def test_halving_rung_plan():
    hv = SuccessiveHalving(screen_rounds=3, eta=4, finalists=3, final_rounds=30)
    assert SuccessiveHalving()._rungs(60) == [(15, 4), (4, 15), (3, 30)]  # the defaults: 1 screening round
    assert hv._rungs(60) == [(15, 12), (4, 15), (3, 30)]
    assert hv._rungs(500) == [(125, 12), (32, 15), (8, 15), (3, 30)]
    assert hv._rungs(2) == [(2, 30)]
    assert all(r <= 30 for _, r in hv._rungs(500)) and math.isfinite(hv.planned_steps(500))


def test_model_measures_only_the_first_few_candidates_and_the_builtin():
    land = Landscape(60, seed=3)
    best = run("model", land)
    touched = set(land.prepared)
    first = land.keys[1:7]  # the tuner hands the keys over in the cost model's order
    assert touched == {BUILTIN_KEY, *first}
    assert best in touched
    assert land.cost[best] <= min(land.cost[k] for k in touched) * 1.1  # halving's choice among them
    assert get_strategy("model").planned_steps(61) == get_strategy("halving").planned_steps(7)


def test_prior_order_sorts_by_the_spec_cost_model_and_falls_back_to_the_default():
    import dataclasses

    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.spec import config_key
    from kernelfleet.worker.search.model import prior_order

    spec = get_spec("swiglu")
    configs = [{"variant": "builtin"}, *spec.space((4096, 4096), "bfloat16")]
    ordered = prior_order(spec, (4096, 4096), "bfloat16", configs)
    assert config_key(ordered[0]) == "builtin" and len(ordered) == len(configs)
    costs = [spec.prior((4096, 4096), "bfloat16", c) for c in ordered[1:]]
    assert costs == sorted(costs)
    assert ordered[1]["vec"] == 8 and ordered[1].get("fm") == 1  # 16-byte accesses, fast math first
    plain = dataclasses.replace(spec, prior=None)  # no model: nearest the default config first
    ordered = prior_order(plain, (4096, 4096), "bfloat16", configs)
    assert ordered[1] == spec.default_config((4096, 4096), "bfloat16")
