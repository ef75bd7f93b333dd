"""Jittered exponential backoff for retrying an unreachable coordinator.

"Full jitter" (AWS architecture blog, 2015): the n-th wait is uniform in
``[base * factor**n * (1 - jitter), base * factor**n]``, capped at ``cap``. The jitter keeps a
fleet of workers that lost the coordinator at the same moment from all knocking again at the same
moment when it comes back.
"""

from __future__ import annotations

import random
import threading


class Backoff:
    """Delays for successive failed attempts; :meth:`reset` after a success."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, factor: float = 2.0, jitter: float = 0.5,
                 rng: random.Random | None = None) -> None:
        if base <= 0 or cap < base or factor < 1 or not 0 <= jitter <= 1:
            raise ValueError("backoff needs 0 < base <= cap, factor >= 1 and 0 <= jitter <= 1")
        self.base = base
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """The wait before the next attempt; counts one more failure."""
        ceiling = min(self.cap, self.base * self.factor ** min(self.failures, 64))
        self.failures += 1
        return ceiling * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        self.failures = 0

    def wait(self, stop: threading.Event) -> float:
        """Sleep for :meth:`next_delay`, waking early if ``stop`` is set; returns the delay chosen."""
        delay = self.next_delay()
        stop.wait(delay)
        return delay
