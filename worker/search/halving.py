"""Successive halving (the default): screen everything cheaply, re-measure the best precisely.

1. Screen: every candidate gets ``screen_rounds`` interleaved rounds. Candidates are ranked by
   the fastest time seen, the preparation's calibration timing included: with so few samples a
   minimum shrugs off a one-off spike (interference only ever makes a launch slower).
2. Keep the best ``1/eta`` (at least ``finalists``) plus the built-in; bring the survivors to
   ``eta`` times as many rounds (at most half the final count), ranked by median. Repeat until at
   most ``finalists`` custom candidates remain.
3. Final: the finalists and the built-in are brought to ``final_rounds`` rounds (the precision
   exhaustive search gives every candidate); the lowest median wins. The final is a race: from
   ``race_from`` rounds on, every ``race_every`` rounds, a finalist whose lower quartile is above
   the leader's upper quartile is clearly slower and stops being measured. The built-in and the
   leader always run the full final.

Budget: once spent, the intermediate stages are skipped: the current best ``finalists`` plus
the built-in get a short final (``screen_rounds`` more rounds).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from kernelfleet.worker.search.base import (
    BUILTIN_KEY,
    Budget,
    Measures,
    SearchStrategy,
    best_of,
    with_builtin,
)


class SuccessiveHalving(SearchStrategy):
    name = "halving"
    description = "screen all candidates cheaply, re-measure the best precisely (default)"

    def __init__(self, screen_rounds: int = 1, eta: int = 4, finalists: int = 3,
                 final_rounds: int = 30, race_from: int = 10, race_every: int = 5) -> None:
        if eta < 2 or finalists < 1 or screen_rounds < 1 or final_rounds < screen_rounds:
            raise ValueError("halving needs eta >= 2, finalists >= 1, 1 <= screen_rounds <= final_rounds")
        if race_from < 4 or race_every < 1:
            raise ValueError("halving races finalists from at least 4 rounds, every >= 1 rounds")
        self.screen_rounds, self.eta = screen_rounds, eta
        self.finalists, self.final_rounds = finalists, final_rounds
        self.race_from, self.race_every = race_from, race_every

    def _rungs(self, n_custom: int) -> list[tuple[int, int]]:
        """(custom survivors, total rounds) per stage after screening."""
        rungs: list[tuple[int, int]] = []
        alive, rounds = n_custom, self.screen_rounds
        while alive > self.finalists:
            alive = max(self.finalists, math.ceil(alive / self.eta))
            last = alive <= self.finalists
            cap = max(rounds, self.final_rounds // 2)  # intermediate stages stay cheaper than the final
            rounds = self.final_rounds if last else min(cap, rounds * self.eta)
            rungs.append((alive, rounds))
        if not rungs or rungs[-1][1] < self.final_rounds:
            rungs.append((alive, self.final_rounds))
        return rungs

    def search(self, keys: Sequence[str], measurer: Measures, budget: Budget,
               rng: random.Random) -> str | None:
        measurer.measure(keys, self.screen_rounds)
        rounds = self.screen_rounds
        alive = _ranked(measurer.best_seen(keys))
        for keep, target in self._rungs(len(alive)):
            short = budget.exhausted()
            if short:
                keep, target = min(keep, self.finalists), min(self.final_rounds, rounds + self.screen_rounds)
            stage = with_builtin(alive[:keep], keys)
            racing = target >= self.final_rounds and not short
            while rounds < target:
                step = target - rounds
                if racing and len(stage) > 2:  # more than the built-in and the leader
                    step = min(step, max(self.race_from - rounds, self.race_every))
                measurer.measure(stage, step)
                rounds += step
                if racing and rounds < target:
                    stage = _drop_clearly_slower(stage, measurer)
            alive = _ranked(measurer.measure(stage, 0))
            if short:
                break
        return best_of(measurer, with_builtin(alive, keys))

    def planned_steps(self, n: int) -> int:
        """An upper bound: racing usually ends some finalists early."""
        steps, rounds = n + n * self.screen_rounds, self.screen_rounds
        for alive, target in self._rungs(max(0, n - 1)):
            steps += (alive + 1) * (target - rounds)
            rounds = target
        return steps


def _ranked(scores: dict[str, float | None]) -> list[str]:
    """Custom candidates (not the built-in) that have a score, fastest first."""
    return [k for _, k in sorted((m, k) for k, m in scores.items() if m is not None and k != BUILTIN_KEY)]


def _drop_clearly_slower(stage: list[str], measurer: Measures) -> list[str]:
    """``stage`` without the custom finalists whose lower quartile is above the leader's upper
    quartile (the built-in always stays)."""
    quartiles = {k: statistics.quantiles(s, n=4) for k in stage if len(s := measurer.samples(k)) >= 2}
    if not quartiles:
        return stage
    leader = min(quartiles, key=lambda k: quartiles[k][1])
    ceiling = quartiles[leader][2]
    return [k for k in stage
            if k in (BUILTIN_KEY, leader) or k not in quartiles or quartiles[k][0] <= ceiling]
