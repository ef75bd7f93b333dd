"""Hooks run after a result is stored (completion or import), in the background loop
(:mod:`kernelfleet.service.reactions`), once per stored result and in the order results were stored.

Other parts of the coordinator register here, e.g. the regression detector::

    from kernelfleet.service.hooks import on_result_stored

    @on_result_stored
    def detect(session_factory: sessionmaker[Session], result_id: int, settings: Settings) -> None: ...

A hook gets the session factory (it opens its own transaction), the new result's id and the
coordinator's settings (those it was started with, not the process environment's). A hook's
exception is logged and never stops the other hooks or later results. Delivery is at least once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)

ResultHook = Callable[[sessionmaker[Session], int, Settings], None]

_hooks: list[ResultHook] = []


def on_result_stored(fn: ResultHook) -> ResultHook:
    """Register ``fn(session_factory, result_id, settings)``; usable as a decorator. Registering twice
    is a no-op."""
    if fn not in _hooks:
        _hooks.append(fn)
    return fn


def registered_hooks() -> list[ResultHook]:
    return list(_hooks)


def run_result_hooks(session_factory: sessionmaker[Session], result_id: int, settings: Settings) -> None:
    """Call every hook for one stored result; log (never raise) a hook's failure."""
    for fn in list(_hooks):
        try:
            fn(session_factory, result_id, settings)
        except Exception:  # a hook's bug must not stop the other hooks or the later results
            name = getattr(fn, "__qualname__", repr(fn))
            logger.exception("result hook %s failed for result %s", name, result_id)
