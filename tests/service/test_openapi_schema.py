"""The published OpenAPI schema describes the errors the coordinator really sends: ``detail`` is a
string, every operation lists its error statuses, tokens are a bearer security scheme."""

from __future__ import annotations

import httpx
from conftest import Coordinator

ERROR_REF = {"$ref": "#/components/schemas/ErrorOut"}


def test_openapi_declares_string_details_error_statuses_and_bearer_auth(coordinator: Coordinator) -> None:
    schema = httpx.get(coordinator.url + "/openapi.json", timeout=30.0).json()
    components = schema["components"]
    assert components["schemas"]["ErrorOut"]["properties"]["detail"]["type"] == "string"
    assert "HTTPValidationError" not in components["schemas"]  # FastAPI's list-of-errors 422
    assert components["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer",
        "description": "the admin token, an API token (scope admin, read or enroll) or a worker's token"}
    ops = {(method.upper(), path): op
           for path, item in schema["paths"].items() for method, op in item.items()}
    assert len(ops) == 42
    results = ops[("GET", "/api/v1/results")]["responses"]["200"]["content"]
    assert {"application/json", "text/csv"} <= set(results)
    assert "409" in ops[("POST", "/api/v1/campaigns/{campaign_id}/retry")]["responses"]
    for (method, path), op in ops.items():
        responses = op["responses"]
        for status in ("422", "500", "503"):
            wanted = {"$ref": "#/components/schemas/Health"} if (path, status) == ("/healthz", "503") \
                else ERROR_REF
            assert responses[status]["content"]["application/json"]["schema"] == wanted, (method, path)
    admin_only = ops[("POST", "/api/v1/campaigns")]
    assert {"401", "403", "413", "415"} <= set(admin_only["responses"])
    assert admin_only["security"] == [{"HTTPBearer": []}]
    assert {"401", "404", "409"} <= set(ops[("POST", "/api/v1/jobs/{job_id}/result")]["responses"])
    assert "403" not in ops[("POST", "/api/v1/leases")]["responses"]  # worker routes never say 403
    assert "202" in ops[("POST", "/api/v1/regressions/scan")]["responses"]  # queued, not run in the request
    assert "404" in ops[("GET", "/api/v1/regressions/scans/{scan_id}")]["responses"]
    triage = ops[("POST", "/api/v1/regressions/{regression_id}/triage")]
    assert {"401", "403", "404", "409", "422"} <= set(triage["responses"])
    assert "404" in ops[("PUT", "/api/v1/regressions/thresholds")]["responses"]  # a series with no run
    public_read = ops[("GET", "/api/v1/profiles/{chip}")]
    assert public_read["security"] == [{}, {"HTTPBearer": []}]  # the dashboard is public by default
    assert "304" in public_read["responses"] and "404" in public_read["responses"]
    job_id = next(p for p in ops[("GET", "/api/v1/jobs/{job_id}")]["parameters"] if p["name"] == "job_id")
    assert (job_id["schema"]["minimum"], job_id["schema"]["maximum"]) == (1, 2**31 - 1)
