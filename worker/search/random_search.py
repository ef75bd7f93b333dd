"""Random search: a seeded uniform sample of the custom candidates, plus the built-in.

Samples ``max(min_candidates, ceil(fraction * n))`` candidates (all of them when the space is
small), prepared in batches of ``batch``; then ``rounds`` interleaved rounds over the sample.
Budget: once spent, no new batch is drawn and the rounds are cut (never below ``min_rounds``).
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
    rounds_loop,
    with_builtin,
)


class RandomSearch(SearchStrategy):
    name = "random"
    description = "measure a random sample of the candidates"

    def __init__(self, fraction: float = 0.25, min_candidates: int = 8, rounds: int = 30,
                 min_rounds: int = 3, batch: int = 8) -> None:
        self.fraction, self.min_candidates, self.rounds = fraction, min_candidates, rounds
        self.min_rounds, self.batch = min_rounds, batch

    def sample_size(self, n_custom: int) -> int:
        return min(n_custom, max(self.min_candidates, math.ceil(self.fraction * n_custom)))

    def search(self, keys: Sequence[str], measurer: Measures, budget: Budget,
               rng: random.Random) -> str | None:
        custom = [k for k in keys if k != BUILTIN_KEY]
        order = rng.sample(custom, self.sample_size(len(custom)))
        chosen = with_builtin([], keys)
        measurer.prepare(chosen)
        for i in range(0, len(order), self.batch):
            if i and budget.exhausted():
                break
            batch = order[i:i + self.batch]
            measurer.prepare(batch)
            chosen.extend(batch)
        live = measurer.ok_keys(chosen)
        rounds_loop(measurer, live, self.rounds, budget, self.min_rounds)
        return best_of(measurer, live)

    def planned_steps(self, n: int) -> int:
        m = 1 + self.sample_size(max(0, n - 1))
        return m + m * self.rounds
