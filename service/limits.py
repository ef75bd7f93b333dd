"""ASGI middleware for request bodies under /api/: a size cap (413) and JSON only (415).

The cap is enforced on the Content-Length header and, for chunked bodies, on the bytes received.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BODY_METHODS = {"POST", "PUT", "PATCH"}


class BodyTooLarge(Exception):
    pass


async def reply(send: Send, status: int, detail: str,
                headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer ``{"detail": detail}`` with ``status`` straight from an ASGI middleware."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, prefix: str = "/api/") -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.max_body_bytes
        too_big = (f"request body too large: the limit is {limit} bytes "
                   f"(KERNELFLEET_MAX_BODY_BYTES); split the upload into smaller requests")
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                await reply(send, 400, "malformed Content-Length header")
                return
            if int(length) > limit:
                await reply(send, 413, too_big)
                return
        if scope["method"] in _BODY_METHODS and (length is None or int(length) > 0):
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            json_like = ctype == "application/json" or (
                ctype.startswith("application/") and ctype.endswith("+json"))
            if not json_like:
                shown = ctype or "none"
                await reply(send, 415, f"unsupported content type {shown!r}: send the body as JSON with "
                                        f"`Content-Type: application/json`")
                return

        received = 0
        started = False
        answered = False  # we sent the 413 ourselves; drop whatever the app sends after

        async def counting_receive() -> Message:
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not started and not answered:
                        answered = True
                        await reply(send, 413, too_big)
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, counting_receive, tracking_send)


def describe_validation_errors(errors: Any) -> str:
    """One readable phrase per pydantic error, e.g.
    ``report.trials.0.median_us: Input should be a finite number``."""
    lines: list[str] = []
    for err in list(errors)[:20]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        where = ".".join(loc)
        msg = str(err.get("msg", "invalid value"))
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            msg = f"malformed JSON: {ctx.get('error', 'could not parse the body')}"
            where = ""
        if err.get("type") == "missing" and not where:
            msg = "the request body is missing: send a JSON object"
        lines.append(f"{where}: {msg}" if where else msg)
    if len(list(errors)) > 20:
        lines.append(f"... and {len(list(errors)) - 20} more problems")
    return "; ".join(lines) or "invalid request"
