"""The background loop of every coordinator process: reactions to new results, then profiles.

Requests only queue work (``result_events``, ``profile_requests``); this loop does it, every
:attr:`Settings.background_interval_seconds`, each step under its own locks so that several
processes and replicas share it without doubling it (:mod:`kernelfleet.service.reactions`,
:mod:`kernelfleet.service.profile_builder`).
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import profile_builder, reactions
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)


def run_once(factory: sessionmaker[Session], settings: Settings) -> None:
    reactions.run_pending(factory)
    profile_builder.build_pending(factory, settings)


async def run_background(factory: sessionmaker[Session], settings: Settings) -> None:
    """Loop for ever; a failed pass is logged and retried on the next one."""
    while True:
        try:
            await asyncio.to_thread(run_once, factory, settings)
        except Exception:  # keep the loop alive: the queued work stays queued
            logger.exception("background pass failed")
        await asyncio.sleep(settings.background_interval_seconds)
