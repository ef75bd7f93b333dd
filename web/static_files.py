"""The dashboard's static files: plotly.js at a content-hashed URL, gzip-compressed, cached for a year.

plotly.min.js is 4.8 MB. It is served from ``/static/plotly-<hash>.min.js`` (the hash of the file
the installed ``plotly`` package holds, so an upgrade changes the URL) with
``Cache-Control: public, max-age=31536000, immutable`` and, to clients that accept it, gzip
(compressed once per process, kept in memory: ~1.4 MB). The plain ``/static/plotly.min.js`` still
answers (compressed, with a short cache) for links made before. The other files are small and
served as they are.
"""

from __future__ import annotations

import gzip
import hashlib
from functools import lru_cache
from pathlib import Path

from fastapi import Request, Response
from fastapi.responses import FileResponse

from kernelfleet.web.plotly_styles import PLOTLY_JS

STATIC_DIR = Path(__file__).parent / "static"
SMALL_FILES = {
    "dashboard.css": STATIC_DIR / "dashboard.css",
    "dashboard.js": STATIC_DIR / "dashboard.js",
}
SHORT_CACHE = "public, max-age=3600"
IMMUTABLE = "public, max-age=31536000, immutable"


@lru_cache(maxsize=1)
def plotly_name() -> str:
    """``plotly-<first 12 hex digits of its SHA-256>.min.js``."""
    digest = hashlib.sha256(PLOTLY_JS.read_bytes()).hexdigest()[:12]
    return f"plotly-{digest}.min.js"


def plotly_url() -> str:
    return f"/static/{plotly_name()}"


@lru_cache(maxsize=1)
def _plotly_gzip() -> bytes:
    return gzip.compress(PLOTLY_JS.read_bytes(), compresslevel=6, mtime=0)


def _accepts_gzip(request: Request) -> bool:
    for part in request.headers.get("accept-encoding", "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*") and params.replace(" ", "") not in ("q=0", "q=0.0"):
            return True
    return False


def static_response(request: Request, name: str) -> Response | None:
    """The response for ``/static/<name>``, or None when there is no such file."""
    if name in (plotly_name(), "plotly.min.js"):
        cache = IMMUTABLE if name != "plotly.min.js" else SHORT_CACHE
        headers = {"Cache-Control": cache, "Vary": "Accept-Encoding"}
        if _accepts_gzip(request):
            return Response(_plotly_gzip(), media_type="text/javascript",
                            headers={**headers, "Content-Encoding": "gzip"})
        return FileResponse(PLOTLY_JS, media_type="text/javascript", headers=headers)
    path = SMALL_FILES.get(name)
    if path is None:
        return None
    media = "text/css" if name.endswith(".css") else "text/javascript"
    return FileResponse(path, media_type=media, headers={"Cache-Control": SHORT_CACHE})
