"""Helpers for the coordinator's pure ASGI middleware (errors, metrics, security headers)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ResponseWatch:
    """Wraps an ASGI ``send``; remembers the status once the response has started."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status: int | None = None

    @property
    def started(self) -> bool:
        return self.status is not None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        await self.send(message)


class HttpMiddleware:
    """Base of a pure ASGI middleware that acts on HTTP requests only (lifespan and websockets
    pass through): subclasses implement :meth:`handle`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError
