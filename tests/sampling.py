"""Rotating samples for the suite's big sweeps.

``make test`` runs a sample of each big sweep, chosen by a seed that changes every day (the UTC date;
``KERNELFLEET_TEST_SEED=<n>`` pins it), so that consecutive days cover every item; ``make test-full``
(``KERNELFLEET_TEST_FULL=1``) runs all of them. Each sampled test prints what it covered and the seed,
so a failure names the seed that reproduces it."""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")
SEED_ENV = "KERNELFLEET_TEST_SEED"
FULL_ENV = "KERNELFLEET_TEST_FULL"


def seed() -> int:
    return int(os.environ.get(SEED_ENV) or datetime.datetime.now(datetime.UTC).date().toordinal())


def full() -> bool:
    return os.environ.get(FULL_ENV, "") not in ("", "0")


def rotating(items: Sequence[T], k: int, salt: str, turn: int | None = None) -> list[T]:
    """``k`` of ``items`` (all of them under ``make test-full``): a window, advanced by ``turn`` (default
    the seed), over a fixed shuffle of the items (by ``salt``), so that ``ceil(len / k)`` consecutive
    turns cover all."""
    if full() or k >= len(items):
        return list(items)
    order = random.Random(salt).sample(list(items), len(items))
    start = (seed() if turn is None else turn) * k % len(order)
    return (order + order)[start:start + k]


def covered(what: str, ran: int, of: int) -> str:
    """The line a sampled test prints: what ran of how many, under which seed."""
    mode = "full sweep" if full() else f"seed {seed()} ({SEED_ENV} to repeat; make test-full runs all)"
    return f"{what}: {ran} of {of} ({ran / max(of, 1):.0%}), {mode}"
