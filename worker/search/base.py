"""The search-strategy interface and its budget.

A strategy decides which candidates to measure and for how many rounds, through a
:class:`Measures` object (the real one is :class:`kernelfleet.worker.measure.Measurer`; tests of
the algorithms pass a synthetic one). Invariants every strategy keeps:

- the built-in (key ``"builtin"``) is measured in every stage, up to the last one, so the chosen
  best is never slower than the built-in as measured;
- the best is the lowest median among the candidates of the final (most precise) stage;
- a candidate dropped before the end of the final stage (racing) has a higher median than the
  candidate that was leading when it was dropped.

Budget: ``Budget(seconds)`` is a soft wall-clock limit on the search, checked between
measurement steps (a step already started finishes). Each strategy documents what it gives up
when the budget runs out; none ever skips the built-in. ``None`` means the strategy's defaults.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

BUILTIN_KEY = "builtin"


class SearchError(Exception):
    """Base class for search errors."""


class UnknownStrategy(SearchError):
    pass


class Measures(Protocol):
    def prepare(self, keys: Sequence[str]) -> None:
        """Build and verify candidates (failures are recorded, not raised)."""

    def measure(self, keys: Sequence[str], rounds: int) -> dict[str, float | None]:
        """Run ``rounds`` more interleaved rounds; the median so far per key (None = failed)."""

    def ok_keys(self, keys: Sequence[str] | None = None) -> list[str]:
        """Those of ``keys`` that are prepared and still good."""

    def samples(self, key: str) -> Sequence[float]:
        """The timed samples of ``key`` so far (empty when failed or not measured)."""

    def best_seen(self, keys: Sequence[str]) -> dict[str, float | None]:
        """The fastest time seen per key, including preparation's calibration timing: a cheap,
        spike-robust screening score (None = failed)."""


@dataclass
class Budget:
    seconds: float | None = None
    _t0: float = field(default_factory=time.perf_counter, repr=False)

    def __post_init__(self) -> None:
        if self.seconds is not None and not self.seconds > 0:
            raise SearchError(f"budget must be a positive number of seconds, got {self.seconds}")

    def start(self) -> Budget:
        self._t0 = time.perf_counter()
        return self

    def spent(self) -> float:
        return time.perf_counter() - self._t0

    def exhausted(self) -> bool:
        return self.seconds is not None and self.spent() >= self.seconds


class SearchStrategy(ABC):
    name: str
    description: str

    @abstractmethod
    def search(self, keys: Sequence[str], measurer: Measures, budget: Budget,
               rng: random.Random) -> str | None:
        """Measure some of ``keys`` (which include ``"builtin"``) and return the best key, or None
        when every measured candidate failed."""

    def builds(self, keys: Sequence[str]) -> list[str]:
        """The candidates a search over ``keys`` builds (all of them, unless the strategy says
        fewer): what a backend may compile ahead, all at once."""
        return list(keys)

    @abstractmethod
    def planned_steps(self, n: int) -> int:
        """About how many steps (candidate preparations + candidate-rounds) a search over ``n``
        candidates takes, for progress bars."""


def rounds_loop(measurer: Measures, keys: Sequence[str], rounds: int, budget: Budget,
                min_rounds: int) -> None:
    """Measure ``keys`` one interleaved round at a time; after ``min_rounds``, stop once the
    budget is spent."""
    for i in range(rounds):
        if i >= min_rounds and budget.exhausted():
            break
        measurer.measure(keys, 1)


def best_of(measurer: Measures, keys: Sequence[str]) -> str | None:
    medians = measurer.measure(keys, 0)
    scored = [(m, k) for k, m in medians.items() if m is not None]
    return min(scored)[1] if scored else None


def with_builtin(keys: Sequence[str], all_keys: Sequence[str]) -> list[str]:
    """``keys`` plus the built-in (when it is a candidate), without duplicates."""
    out = list(dict.fromkeys(keys))
    if BUILTIN_KEY in all_keys and BUILTIN_KEY not in out:
        out.insert(0, BUILTIN_KEY)
    return out
