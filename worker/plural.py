"""Counted nouns for CLI messages: ``plural(1, "worker")`` is "1 worker", ``plural(3, "entry",
"entries")`` is "3 entries"."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    return f"{n} {noun if n == 1 else (many or noun + 's')}"
