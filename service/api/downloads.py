"""``GET /downloads/<wheel>``: the coordinator's own wheel (:mod:`kernelfleet.service.wheel`), what a new
machine installs (the Add a worker page's commands). Public whatever the dashboard's setting: it holds
only the code, and a machine installs it before it has any token."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from kernelfleet.service import wheel
from kernelfleet.service.errors import NotFound

router = APIRouter(tags=["downloads"], include_in_schema=False)


@router.get("/downloads/{filename}")
def download(filename: str, request: Request) -> Response:
    try:
        served = wheel.current()
    except wheel.WheelUnavailable as e:
        raise NotFound(f"no wheel to serve: {e}") from None
    if filename != served.filename:
        raise NotFound(f"no file {filename!r} here; this coordinator serves /downloads/{served.filename}")
    headers = {"ETag": f'"{served.sha256}"', "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match", "").strip('" ') == served.sha256:
        return Response(status_code=304, headers=headers)
    headers["Content-Disposition"] = f'attachment; filename="{served.filename}"'
    return Response(served.data, media_type="application/zip", headers=headers)
