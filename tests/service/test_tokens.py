"""Scoped API tokens: admin, read (the dashboard and `kernelfleet pull`) and enroll (minting enrollment
tokens), created, listed and revoked from the CLI, stored only as SHA-256 digests; `pull` and a private
dashboard work with a read token, admin routes refuse it; `pull` finds a local-mode coordinator's
stored token. One in-thread coordinator per test, with a private dashboard."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from coordinator_helpers import make_report
from inproc import fast_settings, run_cli, serve_in_thread
from sqlalchemy import select

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import ApiToken

ADMIN = "kfa_test-admin"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def private(migrated_db_url: str) -> Iterator[str]:
    with serve_in_thread(fast_settings(migrated_db_url, dashboard_public=False)) as (url, _):
        yield url


def create(url: str, scope: str, name: str) -> str:
    r = run_cli("admin", "tokens", "create", "--scope", scope, "--name", name, "--coordinator", url,
                "--admin-token", ADMIN)
    assert r.exit_code == 0, r.output
    (token,) = re.findall(r"^(kf\w_\S+)$", r.output, re.M)
    return token


def api(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def test_scopes_created_listed_revoked_and_hashed(private: str, migrated_db_url: str) -> None:
    url = private
    read, enroll, admin = (create(url, s, f"{s} one") for s in ("read", "enroll", "admin"))
    assert read.startswith("kfr_") and enroll.startswith("kfn_") and admin.startswith("kfa_")

    listed = run_cli("admin", "tokens", "list", "--json", "--coordinator", url, "--admin-token", ADMIN)
    assert listed.exit_code == 0, listed.output
    assert [(t["name"], t["scope"]) for t in _json(listed.output)] == [
        ("read one", "read"), ("enroll one", "enroll"), ("admin one", "admin")]
    assert not any(t in listed.output for t in (read, enroll, admin))
    engine = make_engine(migrated_db_url)  # at rest: only the SHA-256 digest
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(ApiToken.__table__)).all()
    finally:
        engine.dispose()
    stored = " ".join(str(v) for row in rows for v in row)
    digests = {hashlib.sha256(t.encode()).hexdigest() for t in (read, enroll, admin)}
    assert {r.token_digest for r in rows} == digests
    assert not any(t in stored for t in (read, enroll, admin))

    with api(url, read) as c:  # read: the dashboard and its JSON; no admin route, no enrollment
        assert c.get("/").status_code == 200
        assert c.get("/api/v1/profiles").status_code == 200
        assert c.get("/metrics").status_code == 200
        for method, path in (("GET", "/api/v1/workers"), ("POST", "/api/v1/enroll-tokens"),
                             ("GET", "/api/v1/tokens"), ("POST", "/api/v1/regressions/scan")):
            r = c.request(method, path, json={} if method == "POST" else None)
            assert r.status_code == 403, (path, r.text)
            assert "a read token is not accepted here" in r.json()["detail"], r.text
    with api(url, enroll) as c:  # enroll: mint enrollment tokens, nothing else
        assert c.post("/api/v1/enroll-tokens", json={}).status_code == 201
        assert c.get("/api/v1/workers").status_code == 403
        assert c.get("/api/v1/profiles").status_code == 403
    with api(url, admin) as c:
        assert c.get("/api/v1/workers").status_code == 200
        assert c.get("/api/v1/tokens").status_code == 200
    with api(url, None) as c:
        r = c.get("/api/v1/profiles")
        assert r.status_code == 401 and "a read token" in r.json()["detail"]
        login = c.post("/login", data={"token": read, "next": "/profiles"})  # the sign-in page takes it
        assert login.status_code == 303 and c.get("/profiles").status_code == 200

    (read_id,) = [t["id"] for t in _json(listed.output) if t["scope"] == "read"]
    revoked = run_cli("admin", "tokens", "revoke", str(read_id), "--coordinator", url, "--admin-token", ADMIN)
    assert revoked.exit_code == 0 and "revoked at" in revoked.output, revoked.output
    with api(url, read) as c:
        r = c.get("/api/v1/profiles")
        assert r.status_code == 401 and "was revoked" in r.json()["detail"], r.text

    bad = run_cli("admin", "tokens", "create", "--scope", "owner", "--name", "x", "--coordinator", url,
                  "--admin-token", ADMIN)
    assert bad.exit_code == 2 and "--scope 'owner': choose one of admin, read, enroll" in bad.output
    missing = run_cli("admin", "tokens", "revoke", "999", "--coordinator", url, "--admin-token", ADMIN)
    assert missing.exit_code == 1 and "token 999 does not exist" in missing.output
    refused = run_cli("admin", "tokens", "list", "--coordinator", url, "--admin-token", enroll)
    assert refused.exit_code == 1 and "403" in refused.output and "Traceback" not in refused.output


def _json(text: str) -> list[dict[str, Any]]:
    import json

    return list(json.loads(text))


def _profile_ready(url: str) -> None:
    """Import one H100 report and wait for the background builder's profile."""
    with api(url, ADMIN) as c:
        assert c.post("/api/v1/results/import", json={"reports": [make_report()]}).status_code == 201
        deadline = time.monotonic() + 30
        while c.get(f"/api/v1/profiles/{H100}").status_code != 200:
            assert time.monotonic() < deadline, "no profile after 30 s"
            time.sleep(0.05)


@pytest.fixture
def no_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No token in the environment; pulled profiles go to a temporary folder; returns a data dir."""
    for name in ("KERNELFLEET_TOKEN", "KERNELFLEET_ADMIN_TOKEN", "KERNELFLEET_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setenv("KERNELFLEET_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_pull_with_a_read_token_from_a_private_dashboard(private: str, no_tokens: Path) -> None:
    _profile_ready(private)
    read = create(private, "read", "macs")
    args = ("pull", "--coordinator", private, "--chip", H100, "--no-zmlx")
    refused = run_cli(*args)
    assert refused.exit_code == 1 and "HTTP 401" in refused.output and "--token" in refused.output
    r = run_cli(*args, "--token", read)
    assert r.exit_code == 0, r.output
    assert f"profile for {H100} version 1 installed: " in r.output
    r = run_cli(*args, env={"KERNELFLEET_TOKEN": read})
    assert r.exit_code == 0 and "unchanged" in r.output, r.output


def test_pull_finds_local_mode_s_stored_token(private: str, no_tokens: Path) -> None:
    """`kernelfleet serve` in local mode keeps its generated admin token in its data directory; a pull
    from the same machine (a loopback coordinator URL) finds it there, as `kernelfleet admin` does."""
    _profile_ready(private)
    no_tokens.mkdir()
    (no_tokens / "admin_token").write_text(ADMIN + "\n")
    r = run_cli("pull", "--coordinator", private, "--chip", H100, "--no-zmlx")
    assert r.exit_code == 0, r.output
    assert f"profile for {H100} version 1 installed" in r.output
