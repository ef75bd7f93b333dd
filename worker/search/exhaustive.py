"""Exhaustive search: every candidate, ``rounds`` interleaved rounds each.

Budget: once spent, remaining rounds are cut (never below ``min_rounds``); every candidate is
still measured, and all with the same number of rounds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kernelfleet.worker.search.base import Budget, Measures, SearchStrategy, best_of, rounds_loop


class Exhaustive(SearchStrategy):
    name = "exhaustive"
    description = "measure every candidate precisely"

    def __init__(self, rounds: int = 30, min_rounds: int = 3) -> None:
        self.rounds, self.min_rounds = rounds, min_rounds

    def search(self, keys: Sequence[str], measurer: Measures, budget: Budget,
               rng: random.Random) -> str | None:
        measurer.prepare(keys)
        live = measurer.ok_keys(keys)
        rounds_loop(measurer, live, self.rounds, budget, self.min_rounds)
        return best_of(measurer, live)

    def planned_steps(self, n: int) -> int:
        return n + n * self.rounds
