"""Strategy registry: ``get_strategy("halving")``."""

from __future__ import annotations

from collections.abc import Callable

from kernelfleet.worker.search.base import SearchStrategy, UnknownStrategy
from kernelfleet.worker.search.exhaustive import Exhaustive
from kernelfleet.worker.search.halving import SuccessiveHalving
from kernelfleet.worker.search.model import ModelGuided
from kernelfleet.worker.search.random_search import RandomSearch

DEFAULT_STRATEGY = "halving"
_STRATEGIES: dict[str, Callable[[], SearchStrategy]] = {
    "halving": SuccessiveHalving,
    "exhaustive": Exhaustive,
    "random": RandomSearch,
    "model": ModelGuided,
}


def strategy_names() -> list[str]:
    return list(_STRATEGIES)


def get_strategy(name: str) -> SearchStrategy:
    factory = _STRATEGIES.get(name)
    if factory is None:
        raise UnknownStrategy(f"unknown search strategy {name!r}; choose one of: {', '.join(_STRATEGIES)}")
    return factory()
