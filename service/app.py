"""The FastAPI application: ``create_app(settings)``.

Routers are listed in :data:`API_ROUTERS` (mounted under /api/v1) and :data:`SITE_ROUTERS`
(mounted at the root). Each entry is a module path exposing ``router``; add one line to mount yours.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI
from sqlalchemy import Engine

from kernelfleet.service.api.health import close_probe
from kernelfleet.service.auth_first import AuthFirstMiddleware
from kernelfleet.service.background import run_background
from kernelfleet.service.db import make_sessionmaker
from kernelfleet.service.error_handlers import JsonErrorMiddleware, install_error_handlers
from kernelfleet.service.limits import BodyLimitMiddleware
from kernelfleet.service.longpoll import LeaseWaiters
from kernelfleet.service.metrics import MetricsMiddleware
from kernelfleet.service.migrate import make_checked_engine
from kernelfleet.service.openapi import install_openapi
from kernelfleet.service.params import reject_nul
from kernelfleet.service.read_limit import PublicReadLimitMiddleware
from kernelfleet.service.reaper import run_reaper
from kernelfleet.service.security_headers import SecurityHeadersMiddleware
from kernelfleet.service.settings import Settings
from kernelfleet.web.plotly_styles import plotly_style_hashes

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"

# ---- routers: one line per module exposing `router` -------------------------------------------
API_ROUTERS: tuple[str, ...] = (
    "kernelfleet.service.api.enrollment",
    "kernelfleet.service.api.tokens",
    "kernelfleet.service.api.workers",
    "kernelfleet.service.api.campaigns",
    "kernelfleet.service.api.jobs",
    "kernelfleet.service.api.leases",
    "kernelfleet.service.api.results",
    "kernelfleet.service.api.regressions",
    "kernelfleet.service.api.profiles",
    "kernelfleet.service.api.runtime_settings",
    "kernelfleet.service.api.webhooks",
)
SITE_ROUTERS: tuple[str, ...] = (
    "kernelfleet.service.api.health",
    "kernelfleet.service.api.metrics",
    "kernelfleet.service.api.downloads",
    "kernelfleet.web.router",
)
# ------------------------------------------------------------------------------------------------


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    """Build the coordinator. Raises :class:`~kernelfleet.service.migrate.SchemaNotCurrent` when the
    database is not migrated to head."""
    engine = engine or make_checked_engine(settings.database_url, **settings.engine_options())
    session_factory = make_sessionmaker(engine)
    waiters = LeaseWaiters(session_factory, settings.lease_poll_seconds)
    result_limiter = anyio.CapacityLimiter(settings.result_concurrency)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # sync routes run on anyio's default thread limiter: one thread per pool connection, so no
        # thread waits for a connection (a session never waits for a second thread: see deps.py)
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads()
        tasks = [asyncio.create_task(run_reaper(session_factory, settings), name="kernelfleet-reaper")]
        if settings.background_in_server:  # else `kernelfleet serve` runs it in a process of its own
            tasks.append(asyncio.create_task(run_background(session_factory, settings),
                                             name="kernelfleet-background"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with suppress(asyncio.CancelledError):
                    await task
            await waiters.close()
            close_probe(app.state)
            engine.dispose()

    app = FastAPI(
        title="KernelFleet coordinator",
        version="0.1.0",
        description="Workers enroll, lease tuning jobs and report results; admins run campaigns. "
                    "Every error is JSON `{\"detail\": \"<message>\"}`.",
        lifespan=lifespan,
        dependencies=[Depends(reject_nul)],  # NUL characters in paths and query strings: 422
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = session_factory
    app.state.lease_waiters = waiters
    app.state.result_limiter = result_limiter
    # outermost last: security headers and metrics see every response, the JSON 500 included
    app.add_middleware(AuthFirstMiddleware, fastapi_app=lambda: app, factory=session_factory,
                       settings=settings)  # 401 before a body is read
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(PublicReadLimitMiddleware, concurrency=settings.public_read_concurrency,
                       wait_seconds=settings.public_read_wait_seconds)
    app.add_middleware(JsonErrorMiddleware)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(SecurityHeadersMiddleware, style_hashes=plotly_style_hashes())
    install_error_handlers(app)

    for module in API_ROUTERS:
        app.include_router(importlib.import_module(module).router, prefix=API_PREFIX)
    for module in SITE_ROUTERS:
        app.include_router(importlib.import_module(module).router)
    install_openapi(app, settings)
    return app


def app_from_env() -> FastAPI:
    """The app factory for ``uvicorn --factory`` and ``kernelfleet serve --workers N``: settings from
    the ``KERNELFLEET_*`` environment."""
    from kernelfleet.service.serve_checks import freeze_start_up_objects, quiet_idle_polls

    quiet_idle_polls()  # each server process: idle lease polls stay out of the access log
    app = create_app(Settings())
    freeze_start_up_objects()
    return app
