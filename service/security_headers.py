"""Security headers on every response (API, dashboard pages, static files, errors).

The dashboard loads scripts and styles only from this coordinator (``/static/``); its charts' data
sit in ``<script type="application/json">`` blocks, which browsers never run, and its templates
carry no inline script, event handler or style attribute (no ``'unsafe-inline'`` anywhere; the
browser tests fail on any CSP violation in the console). What the policy still allows:

- ``style-src`` hashes: the style elements plotly.js creates when it loads (fixed text in the
  bundle we serve; :mod:`kernelfleet.web.plotly_styles` hashes them from that file). plotly.js
  otherwise styles its SVG through the CSSOM, which CSP does not govern.
- ``/docs`` and ``/redoc`` (FastAPI's API explorers) load Swagger UI / ReDoc from cdn.jsdelivr.net
  and start it with an inline script, so those pages get their own, looser policy. They show only
  the OpenAPI schema, never stored data.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelfleet.service.asgi import HttpMiddleware

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


def content_security_policy(style_hashes: Sequence[str] = ()) -> str:
    return "; ".join((
        "default-src 'self'",
        "script-src 'self'",
        " ".join(("style-src 'self'", *style_hashes)),
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ))


class SecurityHeadersMiddleware(HttpMiddleware):
    """Adds the headers to every HTTP response that does not set them itself."""

    def __init__(self, app: ASGIApp, style_hashes: Sequence[str] = ()) -> None:
        super().__init__(app)
        common = [(b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
                  (b"referrer-policy", b"same-origin")]
        self.headers = [(b"content-security-policy", content_security_policy(style_hashes).encode()), *common]
        self.docs_headers = [(b"content-security-policy", DOCS_CSP.encode()), *common]

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        extra = self.docs_headers if path in DOCS_PATHS or path.startswith("/docs/") else self.headers

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in extra if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
