"""Bad input: every case gets a clear 4xx with a message, the server stays healthy, and nothing
already stored changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll, lease, make_report
from sqlalchemy import select

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Campaign, EnrollmentToken, Job, Result, Trial, Worker

CAP = 256 * 1024
LLAMA = json.loads((Path(__file__).resolve().parents[1] / "data" / "models" / "llama-3-8b.json").read_text())
JSON = {"content-type": "application/json"}


@dataclass
class Case:
    name: str
    method: str
    path: str
    status: int
    says: str  # a phrase the message must contain (case-insensitive)
    token: str | None = None  # "admin", "worker", "revoked", a literal, or None
    json_body: Any = None
    content: bytes | Iterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def raw_report_with(replace: str, by: str) -> bytes:
    text = json.dumps(make_report())
    assert replace in text
    return text.replace(replace, by, 1).encode()


def snapshot(db_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every stored row, except workers' last-heartbeat time (liveness, touched by any worker call)."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            out: dict[str, list[tuple[Any, ...]]] = {}
            for model in (Campaign, Job, Result, Trial, EnrollmentToken, Worker):
                cols = [c for c in model.__table__.columns if c.name != "last_heartbeat_at"]
                out[model.__tablename__] = [tuple(r) for r in conn.execute(select(*cols).order_by(cols[0]))]
            return out
    finally:
        engine.dispose()


def test_bad_inputs_get_clear_4xx_and_change_nothing(coordinator_factory: Any) -> None:
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_MAX_BODY_BYTES=str(CAP))
    campaign = create_campaign(coordinator, shapes=["1x64", "2x64"])
    _, worker = enroll(coordinator, "good")
    revoked_id, revoked = enroll(coordinator, "revoked")
    with coordinator.admin() as admin:
        assert admin.post(f"/workers/{revoked_id}/revoke").status_code == 200
        used = admin.post("/enroll-tokens", json={}).json()["token"]
        expired = admin.post("/enroll-tokens", json={"ttl_seconds": 0.001}).json()["token"]
    with coordinator.client() as anon:
        r = anon.post("/workers/enroll", json={"enrollment_token": used, "name": "x", "chip": "c",
                                               "backend": "cpu"})
        assert r.status_code == 201
    with coordinator.client(worker) as c:
        held = lease(c)
    assert held is not None
    job = held["job_id"]

    def enroll_body(token: str) -> dict[str, Any]:
        return {"enrollment_token": token, "name": "n", "chip": "c", "backend": "cpu"}

    def result_body(report: Any) -> dict[str, Any]:
        return {"lease_token": held["lease_token"], "report": report}

    many_trials = make_report()
    many_trials["trials"] = [dict(many_trials["trials"][2], config_key=f"tg={i}") for i in range(513)]
    many_samples = make_report()
    many_samples["trials"][1]["samples_us"] = [1.0] * 1001
    bad_best = dict(make_report(), best_config_key="tg=1024,vec=8")
    extra_nested = make_report()
    extra_nested["env"]["gpu_vendor"] = "x"
    c_ok = {"name": "n", "kernels": ["rmsnorm"], "shapes": ["8x8"], "dtypes": ["float16"]}
    result_path = f"/jobs/{job}/result"

    def chunks() -> Iterator[bytes]:
        for _ in range(CAP // 8192 + 8):
            yield b" " * 8192

    cases = [
        Case("oversize body", "POST", "/results/import", 413, "too large", "admin",
             content=b"{" + b" " * (CAP + 10) + b"}", headers=JSON),
        Case("oversize chunked body", "POST", "/campaigns", 413, "too large", "admin", content=chunks(),
             headers=JSON),
        Case("NaN timing", "POST", result_path, 422, "finite", "worker", headers=JSON,
             content=b'{"lease_token": "%s", "report": %s}' % (
                 held["lease_token"].encode(), raw_report_with('"median_us": 10.0', '"median_us": NaN'))),
        Case("Infinity sample", "POST", "/results/import", 422, "finite", "admin",
             headers=JSON,
             content=b'{"reports": [%s]}' % raw_report_with('"samples_us": [10.0',
                                                             '"samples_us": [Infinity')),
        Case("-Infinity golden stat", "POST", "/results/import", 422, "finite", "admin",
             headers=JSON,
             content=b'{"reports": [%s]}' % raw_report_with('"mean": 0.01', '"mean": -Infinity')),
        Case("overflowing float", "POST", "/results/import", 422, "finite", "admin",
             headers=JSON,
             content=b'{"reports": [%s]}' % raw_report_with('"p10_us": 9.9', '"p10_us": 1e999')),
        Case("unknown top-level field", "POST", "/campaigns", 422, "extra inputs", "admin",
             json_body=dict(c_ok, priority=5)),
        Case("unknown nested field", "POST", result_path, 422, "report.env.gpu_vendor", "worker",
             json_body=result_body(extra_nested)),
        Case("very long name", "POST", "/campaigns", 422, "at most 128", "admin",
             json_body=dict(c_ok, name="x" * 10_000)),
        Case("very long worker name", "POST", "/workers/enroll", 422, "at most 128", None,
             json_body=dict(enroll_body("kfe_x"), name="n" * 5000)),
        Case("SQL-looking kernel name", "POST", "/campaigns", 422, "kernels.0", "admin",
             json_body=dict(c_ok, kernels=["rmsnorm'; DROP TABLE jobs; --"])),
        Case("malformed shape", "POST", "/campaigns", 422, "malformed shape", "admin",
             json_body=dict(c_ok, shapes=["4096x"])),
        Case("unknown dtype", "POST", "/campaigns", 422, "float16", "admin",
             json_body=dict(c_ok, dtypes=["float64"])),
        Case("too many jobs", "POST", "/campaigns", 422, "limit is", "admin",
             json_body=dict(c_ok, kernels=[f"k{i}" for i in range(64)],
                            shapes=[f"{i}x1" for i in range(1, 65)],
                            dtypes=["float16", "float32", "bfloat16"])),
        Case("kernel not in the catalog", "POST", "/campaigns", 422, "unknown kernel 'flash_attn'", "admin",
             json_body=dict(c_ok, kernels=["flash_attn"])),
        Case("shape the kernel rejects", "POST", "/campaigns", 422, "rank-3", "admin",
             json_body=dict(c_ok, kernels=["rope"], shapes=["32x4096"])),
        Case("zero max_attempts", "POST", "/campaigns", 422, "max_attempts", "admin",
             json_body=dict(c_ok, max_attempts=0)),
        # a campaign's runtime settings: the same refusals as `campaign create --from-model
        # --runtime-settings`; a runtime-settings result for a kernel job
        Case("runtime settings of an unmapped model", "POST", "/campaigns", 422,
             "runtime_settings.config: architecture 'gpt2' is not mapped", "admin",
             json_body={"name": "n", "runtime_settings": {"config": {"model_type": "gpt2", "n_embd": 768}}}),
        Case("runtime settings in two rounds", "POST", "/campaigns", 422, "runtime_settings.rounds", "admin",
             json_body={"name": "n", "runtime_settings": {"config": LLAMA, "rounds": 2}}),
        Case("runtime settings at an unknown workload", "POST", "/campaigns", 422,
             "runtime_settings.workloads.0", "admin",
             json_body={"name": "n", "runtime_settings": {"config": LLAMA, "workloads": ["train:1"]}}),
        Case("kernel dtypes without kernels", "POST", "/campaigns", 422, "give kernels too", "admin",
             json_body={"name": "n", "dtypes": ["float16"], "runtime_settings": {"config": LLAMA}}),
        Case("runtime settings as a kernel job's result", "POST", result_path, 422,
             "its result is a report, not runtime_settings", "worker",
             json_body={"lease_token": held["lease_token"], "runtime_settings": {
                 "schema": "kernelfleet-runtime-settings/1", "chip": "NVIDIA H100 80GB HBM3",
                 "backend": "cuda", "mlx_version": "0.32.4", "entries": [
                     {"model": "llama h4096 x32", "dtype": "bf16", "workload": "decode:1",
                      "settings": {}}]}}),
        Case("a result that is neither", "POST", result_path, 422, "give a report", "worker",
             json_body={"lease_token": held["lease_token"]}),
        Case("missing admin token", "GET", "/campaigns", 401, "missing admin token"),
        Case("missing worker token", "POST", "/leases", 401, "missing worker token", json_body={}),
        Case("invalid token", "GET", "/workers", 401, "invalid admin token", "kfa_not-a-real-token"),
        Case("wrong auth scheme", "GET", "/workers", 401, "missing admin token",
             headers={"authorization": "Basic dXNlcjpwYXNz"}),
        Case("worker token on admin route", "POST", "/campaigns", 403, "admin token", "worker",
             json_body=c_ok),
        Case("revoked worker token", "POST", "/leases", 401, "revoked", "revoked", json_body={}),
        # authentication comes before the body is read: no 422 (nor the cost of parsing) for a caller
        # without a valid token
        Case("invalid body, no token", "POST", result_path, 401, "missing worker token",
             content=b'{"report": [', headers=JSON),
        Case("invalid body, unknown token", "POST", result_path, 401, "invalid worker token", "kfw_nope",
             json_body={"report": 5}),
        Case("invalid body, no admin token", "POST", "/results/import", 401, "missing admin token",
             content=b"[" * 1000, headers=JSON),
        Case("invalid body, unknown admin token", "POST", "/campaigns", 401, "invalid admin token",
             "kfa_nope", json_body={"name": 5}),
        Case("GET on a POST-only route", "GET", "/regressions/scan", 405, "not allowed", "admin"),
        Case("expired enrollment token", "POST", "/workers/enroll", 401, "expired",
             json_body=enroll_body(expired)),
        Case("used enrollment token", "POST", "/workers/enroll", 401, "already used",
             json_body=enroll_body(used)),
        Case("unknown enrollment token", "POST", "/workers/enroll", 401, "unknown enrollment token",
             json_body=enroll_body("kfe_nope")),
        Case("wrong content type", "POST", "/campaigns", 415, "application/json", "admin",
             content=json.dumps(c_ok).encode(), headers={"content-type": "text/plain"}),
        Case("form body", "POST", "/workers/enroll", 415, "application/json", None,
             content=b"name=x", headers={"content-type": "application/x-www-form-urlencoded"}),
        Case("malformed JSON", "POST", "/campaigns", 422, "malformed json", "admin",
             content=b'{"name": "x", "kernels": [', headers=JSON),
        Case("JSON array body", "POST", "/campaigns", 422, "valid dictionary", "admin", json_body=[c_ok]),
        Case("empty body", "POST", "/campaigns", 422, "missing", "admin"),
        Case("unknown job id", "POST", "/jobs/999999/heartbeat", 404, "job 999999 does not exist", "worker",
             json_body={"lease_token": held["lease_token"]}),
        Case("unknown campaign id", "GET", "/campaigns/424242", 404, "campaign 424242", "admin"),
        Case("unknown worker id", "POST", "/workers/31337/revoke", 404, "worker 31337", "admin"),
        Case("non-integer job id", "POST", "/jobs/abc/fail", 422, "job_id", "worker",
             json_body={"lease_token": "x", "error": "y"}),
        Case("unknown route", "GET", "/nope", 404, "no such route", "admin"),
        Case("wrong method", "DELETE", "/campaigns", 405, "not allowed", "admin"),
        Case("bad state filter", "GET", "/jobs?state=running", 422, "state", "admin"),
        Case("negative ttl", "POST", "/enroll-tokens", 422, "ttl_seconds", "admin",
             json_body={"ttl_seconds": -5}),
        Case("too many trials", "POST", result_path, 422, "at most 512", "worker",
             json_body=result_body(many_trials)),
        Case("too many samples", "POST", result_path, 422, "at most 1000", "worker",
             json_body=result_body(many_samples)),
        Case("best config is a failed trial", "POST", result_path, 422, "best_config_key", "worker",
             json_body=result_body(bad_best)),
        Case("stale lease token", "POST", result_path, 409, "no longer valid", "worker",
             json_body={"lease_token": "kfl_other", "report": make_report(shape=held["shape"])}),
        Case("heartbeat on a job never leased", "POST", f"/jobs/{job + 1}/heartbeat", 409, "no longer valid",
             "worker", json_body={"lease_token": held["lease_token"]}),
        # NUL characters (PostgreSQL cannot store them) in the path, the query and every kind of body
        Case("NUL in a path", "GET", "/profiles/a%00b", 422, "chip: must not contain NUL"),
        Case("NUL in a query value", "GET", "/regressions?chip=a%00b", 422, "chip: must not contain NUL"),
        Case("NUL in a query name", "GET", "/workers?a%00b=1", 422, "must not contain NUL", "admin"),
        Case("NUL in an enroll body", "POST", "/workers/enroll", 422, "name: must not contain NUL",
             json_body=dict(enroll_body("kfe_x"), name="a\x00b")),
        Case("NUL in a campaign body", "POST", "/campaigns", 422, "name: must not contain NUL", "admin",
             json_body=dict(c_ok, name="\x00")),
        Case("NUL in an imported report", "POST", "/results/import", 422,
             "reports.0.env.chip: must not contain NUL", "admin",
             json_body={"reports": [make_report(chip="Apple M3\x00")]}),
        Case("NUL in a trial config key", "POST", result_path, 422, "trials.0.config: must not contain NUL",
             "worker", json_body=result_body(dict(make_report(), trials=[
                 dict(make_report()["trials"][0], config={"tg\x00": 1})]))),
        Case("NUL in a failure message", "POST", f"/jobs/{job}/fail", 422, "error: must not contain NUL",
             "worker", json_body={"lease_token": held["lease_token"], "error": "boom\x00"}),
        Case("NUL in a lease token", "POST", f"/jobs/{job}/heartbeat", 422,
             "lease_token: must not contain NUL", "worker", json_body={"lease_token": "kfl_\x00"}),
        # a free-form model config: lists that mix strings with booleans and numbers (schemathesis seed
        # 20261129 found the first one answered 500)
        Case("a string and a boolean in one config list", "POST", "/campaigns", 422, "runtime_settings",
             "admin", json_body={"name": "n", "runtime_settings": {"config": {"x": ["a", True]}}}),
        Case("NUL after a number in a config list", "POST", "/campaigns", 422,
             "runtime_settings.config: must not contain NUL", "admin",
             json_body={"name": "n", "runtime_settings": {"config": {**LLAMA, "x": [1, ["a\x00"]]}}}),
        Case("NUL in an acknowledge note", "POST", "/regressions/1/acknowledge", 422,
             "note: must not contain NUL", "admin", json_body={"note": "\x00"}),
        # integers past the database's columns: ids are PostgreSQL `integer`, offsets 64-bit
        Case("id of 2**31", "GET", "/regressions/2147483648", 422, "less than or equal to 2147483647"),
        Case("job id of 2**31", "POST", "/jobs/2147483648/heartbeat", 422, "less than or equal to 2147483647",
             "worker", json_body={"lease_token": held["lease_token"]}),
        Case("huge campaign id", "GET", "/campaigns/99999999999999999999", 422, "campaign_id", "admin"),
        Case("campaign filter of 2**31", "GET", "/jobs?campaign_id=2147483648", 422, "campaign_id", "admin"),
        Case("zero id", "POST", "/workers/0/revoke", 422, "greater than or equal to 1", "admin"),
        Case("largest id", "GET", "/jobs/2147483647", 404, "job 2147483647 does not exist", "admin"),
        Case("offset of 2**63", "GET", "/jobs?offset=9223372036854775808", 422,
             "less than or equal to 9223372036854775807", "admin"),
        Case("regressions offset of 2**63", "GET", "/regressions?offset=9223372036854775808", 422, "offset"),
        Case("campaigns offset of 2**63", "GET", "/campaigns?offset=9223372036854775808", 422, "offset",
             "admin"),
        # strict types: what the schema calls a number, integer or boolean is exactly that
        Case("boolean ttl", "POST", "/enroll-tokens", 422, "ttl_seconds: input should be a valid number",
             "admin", json_body={"ttl_seconds": True}),
        Case("string ttl", "POST", "/enroll-tokens", 422, "ttl_seconds", "admin",
             json_body={"ttl_seconds": "60"}),
        Case("boolean gpu cores", "POST", "/workers/enroll", 422,
             "gpu_cores: input should be a valid integer",
             json_body=dict(enroll_body("kfe_x"), gpu_cores=True)),
        Case("string max_attempts", "POST", "/campaigns", 422, "max_attempts", "admin",
             json_body=dict(c_ok, max_attempts="3")),
        Case("integer as a boolean", "POST", "/regressions/1/acknowledge", 422, "whole_group", "admin",
             json_body={"whole_group": 1}),
        Case("string as a trial count", "POST", result_path, 422, "report.trials.0.n", "worker",
             json_body=result_body(dict(make_report(), trials=[dict(make_report()["trials"][0], n="20")]))),
    ]
    assert len(cases) >= 25
    tokens = {"admin": coordinator.admin_token, "worker": worker, "revoked": revoked}

    before = snapshot(coordinator.db_url)
    failures: list[str] = []
    with httpx.Client(base_url=coordinator.url + "/api/v1", timeout=30.0) as http:
        for case in cases:
            headers = dict(case.headers)
            if case.token is not None:
                headers["authorization"] = f"Bearer {tokens.get(case.token, case.token)}"
            kwargs: dict[str, Any] = {"headers": headers}
            if case.json_body is not None:
                kwargs["json"] = case.json_body
            elif case.content is not None:
                kwargs["content"] = case.content
            r = http.request(case.method, case.path, **kwargs)
            try:
                detail = r.json()["detail"]
            except (ValueError, KeyError, TypeError):
                failures.append(f"{case.name}: no JSON detail in {r.status_code} {r.text[:200]!r}")
                continue
            if r.status_code != case.status or not isinstance(detail, str) \
                    or case.says.lower() not in detail.lower():
                failures.append(f"{case.name}: wanted {case.status} saying {case.says!r}, "
                                f"got {r.status_code} {detail!r}"[:400])
            assert "Traceback" not in r.text
            health = httpx.get(coordinator.url + "/healthz", timeout=10.0)
            if health.status_code != 200:
                failures.append(f"{case.name}: server unhealthy afterwards")
        # a 405 says what the path does allow (every route on it)
        allowed = {path: http.request("PATCH", path, headers={"authorization": f"Bearer {tokens['admin']}"},
                                      json={}).headers.get("allow")
                   for path in ("/regressions/scan", f"/campaigns/{campaign['id']}", "/campaigns")}
    assert allowed == {"/regressions/scan": "POST", f"/campaigns/{campaign['id']}": "DELETE, GET",
                       "/campaigns": "GET, POST"}, allowed
    assert not failures, "\n".join(failures)
    assert snapshot(coordinator.db_url) == before
    with coordinator.admin() as admin:
        assert admin.get(f"/campaigns/{campaign['id']}").json()["progress"]["leased"] == 1


def test_sql_looking_names_are_stored_verbatim(coordinator: Coordinator) -> None:
    sql = "x'); DROP TABLE jobs; --"
    chip = 'Apple M3"; DELETE FROM workers WHERE 1=1; --'
    campaign = create_campaign(coordinator, name=sql, target_chip=chip)
    worker_id, token = enroll(coordinator, name=sql, chip=chip, backend="metal")
    with coordinator.admin() as admin:
        assert admin.get(f"/campaigns/{campaign['id']}").json()["name"] == sql
        w = next(w for w in admin.get("/workers").json() if w["id"] == worker_id)
        assert (w["name"], w["chip"]) == (sql, chip)
    with coordinator.client(token) as c:  # the glob is the chip itself, so it matches
        assert lease(c) is not None
    with coordinator.admin() as admin:
        jobs = admin.get("/jobs").json()
        assert len(jobs) == 1 and jobs[0]["target_chip"] == chip and jobs[0]["state"] == "leased"
