"""The coordinator's address in pages comes from settings (``KERNELFLEET_PUBLIC_URL``), never from
a request's ``Host`` or ``X-Forwarded-*`` headers; every response carries the security headers."""

from __future__ import annotations

import httpx
from conftest import Coordinator
from coordinator_helpers import make_report

from kernelfleet.service.security_headers import DOCS_CSP, content_security_policy
from kernelfleet.web.plotly_styles import plotly_style_hashes

SPOOF = {"Host": "evil.example:666", "X-Forwarded-Host": "evil.example:666", "X-Forwarded-Proto": "https",
         "X-Forwarded-For": "203.0.113.9", "Forwarded": "host=evil.example;proto=https"}
CHIP = "NVIDIA H100 80GB HBM3"


def _import_a_result(coordinator: Coordinator) -> None:
    with coordinator.admin() as admin:
        assert admin.post("/results/import", json={"reports": [make_report(chip=CHIP)]}).status_code == 201


def test_pull_command_uses_the_configured_public_url(coordinator_factory) -> None:  # type: ignore[no-untyped-def]
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_PUBLIC_URL="https://fleet.example.org/")
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        fleet = http.get("/", headers=SPOOF)  # no workers yet: the page shows the worker command
        assert "kernelfleet worker --coordinator https://fleet.example.org --enroll-token" in fleet.text
        _import_a_result(coordinator)
    coordinator.profile(CHIP)  # the background builder has made the chip's profile
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        page = http.get("/profiles", headers=SPOOF).text
    # the chip-wide profile and its MLX version's
    assert page.count("kernelfleet pull --coordinator https://fleet.example.org --chip") == 2
    assert page.count("--mlx-version 0.32.4") == 1
    assert "evil" not in page and "evil" not in fleet.text


def test_default_public_url_is_the_listening_address(coordinator: Coordinator) -> None:
    _import_a_result(coordinator)
    page = httpx.get(coordinator.url + "/profiles", headers=SPOOF, timeout=30.0).text
    assert f"kernelfleet pull --coordinator http://127.0.0.1:{coordinator.port} --chip" in page
    assert "evil" not in page


def test_login_cookie_is_secure_behind_an_https_public_url(coordinator_factory) -> None:  # type: ignore[no-untyped-def]
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_PUBLIC_URL="https://fleet.example.org",
                                                   KERNELFLEET_DASHBOARD_PUBLIC="false")
    r = httpx.post(coordinator.url + "/login", data={"token": coordinator.admin_token, "next": "/"},
                   timeout=30.0)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "secure" in cookie and "samesite=strict" in cookie


def test_security_headers_on_every_kind_of_response(coordinator: Coordinator) -> None:
    expected = {"content-security-policy": content_security_policy(plotly_style_hashes()),
                "x-frame-options": "DENY", "x-content-type-options": "nosniff",
                "referrer-policy": "same-origin"}
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        responses = {
            "HTML page": http.get("/"),
            "HTML 404 page": http.get("/runs/424242"),
            "JSON": http.get("/api/v1/profiles"),
            "JSON 401": http.get("/api/v1/workers"),
            "JSON 404 (no route)": http.get("/no/such/route"),
            "JSON 413 (body cap)": http.post("/api/v1/campaigns", content=b"{" + b" " * (5 * 2**20) + b"}",
                                             headers={"content-type": "application/json"}),
            "JSON 415": http.post("/api/v1/campaigns", content=b"x", headers={"content-type": "text/plain"}),
            "JSON 422 (NUL)": http.get("/api/v1/profiles/a%00b"),
            "static CSS": http.get("/static/dashboard.css"),
            "static JS": http.get("/static/plotly.min.js"),
            "health": http.get("/healthz"),
            "metrics": http.get("/metrics"),
            "OpenAPI": http.get("/openapi.json"),
        }
        docs = http.get("/docs")
    wrong = [f"{what} ({r.status_code}): {name}={r.headers.get(name)!r}" for what, r in responses.items()
             for name, value in expected.items() if r.headers.get(name) != value]
    assert not wrong, "\n".join(wrong)
    assert docs.headers["content-security-policy"] == DOCS_CSP and docs.headers["x-frame-options"] == "DENY"
    # the dashboard's own pages need no inline script or style: nothing the policy would block
    page = responses["HTML page"].text
    assert "<script>" not in page and " style=" not in page and " onclick=" not in page
