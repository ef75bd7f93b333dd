"""Model-guided search: measure only the few candidates a cheap cost model ranks best.

On MLX's CUDA backend every custom candidate costs an NVRTC compile the first time it runs (about
1.5 s on an H100/H200 host), so a search over a 50-170 config space spends most of a minute
compiling. This strategy measures the built-in and the ``top`` custom candidates first in the
order it is given -- the tuner orders them by :func:`prior_order` (the spec's ``prior``, a cost
model computed without compiling anything, or the distance from the spec's default config) -- and
runs successive halving over those alone. Nothing else is built.

Budget: as successive halving's (over the chosen candidates).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from kernelfleet.kernels.spec import Config, KernelSpec, Shape, config_key
from kernelfleet.worker.search.base import BUILTIN_KEY, Budget, Measures, SearchStrategy, with_builtin
from kernelfleet.worker.search.halving import SuccessiveHalving

TOP = 6


class ModelGuided(SearchStrategy):
    name = "model"
    description = "measure only the cost model's best few candidates (fastest tuning)"

    def __init__(self, top: int = TOP) -> None:
        if top < 1:
            raise ValueError("model search needs top >= 1")
        self.top = top
        self.halving = SuccessiveHalving()

    def choose(self, keys: Sequence[str]) -> list[str]:
        return with_builtin([k for k in keys if k != BUILTIN_KEY][: self.top], keys)

    def builds(self, keys: Sequence[str]) -> list[str]:
        return self.choose(keys)

    def search(self, keys: Sequence[str], measurer: Measures, budget: Budget,
               rng: random.Random) -> str | None:
        return self.halving.search(self.choose(keys), measurer, budget, rng)

    def planned_steps(self, n: int) -> int:
        return self.halving.planned_steps(min(n, self.top + 1))


def prior_order(spec: KernelSpec, shape: Shape, dtype: str, configs: Sequence[Config]) -> list[Config]:
    """``configs`` sorted by the spec's cost model, expected fastest first (stable; the built-in stays
    first). Without a ``prior`` on the spec: by distance from the spec's default config (log2 of
    each numeric parameter's ratio, plus one for each other parameter that differs)."""
    if spec.prior is not None:
        prior = spec.prior

        def cost(c: Config) -> float:
            return prior(shape, dtype, c)
    else:
        default = spec.default_config(shape, dtype)

        def cost(c: Config) -> float:
            d = 0.0
            for k in set(c) | set(default):
                a, b = c.get(k), default.get(k)
                if isinstance(a, int) and isinstance(b, int) and a > 0 and b > 0:
                    d += abs(math.log2(a / b))
                elif a != b:
                    d += 1.0
            return d

    builtin = [c for c in configs if config_key(c) == BUILTIN_KEY]
    custom = [c for c in configs if config_key(c) != BUILTIN_KEY]
    return builtin + sorted(custom, key=cost)
