"""Empty states, a private dashboard, and worker status from the heartbeat age, each on a fresh
real coordinator (SQLite, and PostgreSQL when configured)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from browser import launch, open_page

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()


EMPTY = {
    "/": "kernelfleet admin enroll-token",
    "/chips": "No chips yet",
    "/kernels": "kernelfleet admin campaign create",
    "/compare": "Nothing to compare yet",
    "/regressions": "No regressions detected",
    "/campaigns": "kernelfleet admin campaign create --name first --kernel rmsnorm",
    "/profiles": "No profiles yet",
}


def test_empty_pages_tell_a_new_user_the_next_step(browser: Any, coordinator: Any) -> None:
    for path, hint in EMPTY.items():
        page = open_page(browser, coordinator.url + path)
        assert page.status == 200, path
        assert hint in page.text(), (path, page.text())
        assert page.errors == [], (path, page.errors)
        page.page.close()
    page = open_page(browser, coordinator.url + "/")
    assert f"--coordinator {coordinator.url} --enroll-token" in page.text()
    page.page.close()


def test_private_dashboard_needs_the_admin_token(browser: Any, coordinator_factory: Any) -> None:
    c = coordinator_factory(KERNELFLEET_DASHBOARD_PUBLIC="false")
    with httpx.Client(base_url=c.url, timeout=30) as client:
        for path in ("/", "/chips", "/campaigns", "/regressions", "/profiles", "/runs/1"):
            r = client.get(path)
            assert r.status_code == 401 and "Sign in" in r.text, path
        assert client.get("/", headers={"Authorization": f"Bearer {c.admin_token}"}).status_code == 200
        assert client.get("/static/dashboard.css").status_code == 200  # the login page needs its styles
    page = open_page(browser, c.url + "/campaigns")
    assert page.status == 401
    page.page.click("a.button")  # "Sign in with the admin token"
    page.page.fill("input[name=token]", "not-the-token")
    page.page.click("form button[type=submit]")
    page.page.wait_for_selector(".flash.bad")
    assert "not the coordinator's admin token" in page.text()
    page.page.fill("input[name=token]", c.admin_token)
    page.page.click("form button[type=submit]")
    page.page.wait_for_load_state("load")
    assert page.page.url == c.url + "/campaigns"  # back where the user was going
    assert "No campaigns yet" in page.text()
    cookie = next(k for k in page.page.context.cookies() if k["name"] == "kernelfleet_admin")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    # the console saw the 401s on the way in (the page the user first landed on, the wrong token)
    assert all("401" in e for e in page.errors), page.errors
    page.page.close()


def test_worker_status_follows_the_last_heartbeat(browser: Any, coordinator_factory: Any) -> None:
    c = coordinator_factory(KERNELFLEET_WORKER_OFFLINE_AFTER_SECONDS="3")
    tokens = {}
    for name in ("quiet", "busy"):
        with c.admin() as admin:
            enroll = admin.post("/enroll-tokens", json={}).json()["token"]
        with c.client() as anon:
            r = anon.post(
                "/workers/enroll",
                json={
                    "enrollment_token": enroll,
                    "name": name,
                    "chip": "Apple M4",
                    "backend": "metal",
                    "os": "macOS 15.2",
                    "mlx_version": "0.32.4",
                },
            )
            assert r.status_code == 201, r.text
            tokens[name] = r.json()["token"]
    time.sleep(4.5)  # "quiet" passes the 3 s offline threshold...
    with c.client(tokens["busy"]) as w:  # ...while "busy" calls in (a heartbeat)
        assert w.get("/workers/me").status_code == 200
    page = open_page(browser, c.url + "/")
    status = {r[0].split(" #")[0]: r[3] for r in page.rows("workers")}
    assert status == {"quiet": "offline", "busy": "online"}
    assert page.errors == []
    page.page.close()


def test_names_are_escaped_not_run(browser: Any, coordinator: Any) -> None:
    hostile = '<img src=x onerror="window.pwned=1">'
    with coordinator.admin() as admin:
        enroll = admin.post("/enroll-tokens", json={}).json()["token"]
    with coordinator.client() as anon:
        body = {"enrollment_token": enroll, "name": hostile, "chip": "<script>window.pwned=2</script>",
                "backend": "metal"}
        assert anon.post("/workers/enroll", json=body).status_code == 201
    for path in ("/", "/chips", "/chips/" + quote("<script>window.pwned=2</script>", safe="")):
        page = open_page(browser, coordinator.url + path)
        assert page.status == 200, path
        assert page.page.evaluate("() => window.pwned") is None, path
        assert "<script>window.pwned=2</script>" in page.text(), path
        page.page.close()
