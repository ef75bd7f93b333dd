"""``GET /metrics``: Prometheus text format (see :mod:`kernelfleet.service.metrics`).

Readable like the dashboard (``DashboardDep``): public unless ``KERNELFLEET_DASHBOARD_PUBLIC=false``,
then the admin token as a bearer header (Prometheus: ``authorization: {credentials: ...}``). It
shows what the dashboard already shows (fleet activity, queue depth), nothing secret.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from kernelfleet.service import metrics
from kernelfleet.service.deps import DashboardDep, DbDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format"}})
def scrape(_: DashboardDep, factory: DbDep) -> Response:
    return Response(metrics.render(factory), media_type=CONTENT_TYPE_LATEST)
