"""Search strategies over a kernel's candidate configs: exhaustive, random, successive halving."""

from kernelfleet.worker.search.base import BUILTIN_KEY, Budget, Measures, SearchStrategy, UnknownStrategy
from kernelfleet.worker.search.registry import DEFAULT_STRATEGY, get_strategy, strategy_names

__all__ = ["BUILTIN_KEY", "Budget", "DEFAULT_STRATEGY", "Measures", "SearchStrategy", "UnknownStrategy",
           "get_strategy", "strategy_names"]
