"""Security headers on every response (API, dashboard pages, static files, errors).

The dashboard loads scripts and styles only from this coordinator (``/static/``); its charts'
data sit in ``<script type="application/json">`` blocks, which browsers never run. Two allowances:

- ``style-src`` lists the hash of the *empty* string: plotly.js appends an empty ``<style>``
  element and fills it with ``CSSStyleSheet.insertRule``, which CSP does not govern; the hash lets
  only an empty inline style element through, so no injected CSS text can apply.
- ``/docs`` and ``/redoc`` (FastAPI's API explorers) load Swagger UI / ReDoc from
  cdn.jsdelivr.net and start it with an inline script, so those two pages get their own, looser
  policy. They show only the OpenAPI schema, never stored data.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

EMPTY_STYLE_HASH = "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"  # sha256 of ""

CSP = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    f"style-src 'self' {EMPTY_STYLE_HASH}",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))
DOCS_CDN = "https://cdn.jsdelivr.net"
DOCS_CSP = "; ".join((
    "default-src 'self'",
    f"script-src 'self' 'unsafe-inline' {DOCS_CDN}",
    f"style-src 'self' 'unsafe-inline' {DOCS_CDN}",
    f"img-src 'self' data: {DOCS_CDN} https://fastapi.tiangolo.com",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
))
DOCS_PATHS = ("/docs", "/redoc")


def security_headers(path: str) -> list[tuple[bytes, bytes]]:
    csp = DOCS_CSP if path in DOCS_PATHS or path.startswith("/docs/") else CSP
    return [
        (b"content-security-policy", csp.encode()),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    ]


class SecurityHeadersMiddleware:
    """Adds the headers to every HTTP response that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = security_headers(scope["path"])

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in extra if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
