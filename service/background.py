"""The background loop of every coordinator process: reactions to new results, then profiles, then
the campaign sweep; beside it, the alerts loop.

Requests only queue work (``result_events``, ``profile_requests``); this loop does it, every
:attr:`Settings.background_interval_seconds`, each step under its own locks so that several
processes and replicas share it without doubling it (:mod:`kernelfleet.service.reactions`,
:mod:`kernelfleet.service.profile_builder`, :mod:`kernelfleet.service.campaign_control`). Webhook
alerts (:mod:`kernelfleet.service.notifications`) run in a loop of their own at the same interval,
so a slow receiver never delays reactions or profiles.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import campaign_control, notifications, profile_builder, reactions
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)


def run_once(factory: sessionmaker[Session], settings: Settings) -> None:
    reactions.run_pending(factory)
    profile_builder.build_pending(factory, settings)
    campaign_control.sweep(factory)


async def _loop(name: str, step: Callable[[sessionmaker[Session], Settings], object],
                factory: sessionmaker[Session], settings: Settings) -> None:
    while True:
        try:
            await asyncio.to_thread(step, factory, settings)
        except Exception:  # keep the loop alive: the queued work stays queued
            logger.exception("%s pass failed", name)
        await asyncio.sleep(settings.background_interval_seconds)


async def run_background(factory: sessionmaker[Session], settings: Settings) -> None:
    """Loop for ever; a failed pass is logged and retried on the next one."""
    await asyncio.gather(_loop("background", run_once, factory, settings),
                         _loop("alerts", notifications.run_pending, factory, settings))
