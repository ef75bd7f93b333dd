"""Successive halving (the default): screen everything cheaply, re-measure the best precisely.

1. Screen: every candidate gets ``screen_rounds`` interleaved rounds.
2. Keep the best ``1/eta`` (at least ``finalists``) plus the built-in; bring the survivors to
   ``eta`` times as many rounds (at most half the final count). Repeat until at most
   ``finalists`` custom candidates remain.
3. Final: the finalists and the built-in are brought to ``final_rounds`` rounds (the same
   precision exhaustive search gives every candidate); the lowest median wins.

Budget: once spent, the intermediate stages are skipped: the current best ``finalists`` plus
the built-in get a short final (``screen_rounds`` more rounds).
"""

from __future__ import annotations

import math
import random
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

    def __init__(self, screen_rounds: int = 2, eta: int = 4, finalists: int = 3,
                 final_rounds: int = 30) -> None:
        if eta < 2 or finalists < 1 or screen_rounds < 1 or final_rounds < screen_rounds:
            raise ValueError("halving needs eta >= 2, finalists >= 1, 1 <= screen_rounds <= final_rounds")
        self.screen_rounds, self.eta = screen_rounds, eta
        self.finalists, self.final_rounds = finalists, final_rounds

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
        medians = measurer.measure(keys, self.screen_rounds)
        rounds = self.screen_rounds
        ranked = sorted((m, k) for k, m in medians.items() if m is not None and k != BUILTIN_KEY)
        alive = [k for _, k in ranked]
        for keep, target in self._rungs(len(alive)):
            short = budget.exhausted()
            if short:
                keep, target = min(keep, self.finalists), min(self.final_rounds, rounds + self.screen_rounds)
            stage = with_builtin(alive[:keep], keys)
            medians = measurer.measure(stage, target - rounds)
            rounds = target
            alive = [k for _, k in sorted((m, k) for k, m in medians.items()
                                          if m is not None and k != BUILTIN_KEY)]
            if short:
                break
        return best_of(measurer, with_builtin(alive, keys))

    def planned_steps(self, n: int) -> int:
        steps, rounds = n + n * self.screen_rounds, self.screen_rounds
        for alive, target in self._rungs(max(0, n - 1)):
            steps += (alive + 1) * (target - rounds)
            rounds = target
        return steps
