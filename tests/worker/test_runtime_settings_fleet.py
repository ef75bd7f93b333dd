"""MLX's runtime settings through the fleet, end to end with a real coordinator and real MLX: a
campaign asks for a model's runtime settings, a real worker (`kernelfleet worker`) leases the job,
searches them on this machine (each setting in its own process) and reports them through the lease;
`kernelfleet pull` on the same chip installs them beside the profile, where
`kernelfleet.apply_settings` reads them before MLX starts. The worker can also send a file itself
(`kernelfleet settings push`, its own token). A push for another chip, a malformed file, a result
for another model and an unknown chip get clear 4xx answers, and nothing stored changes. A gain an
MLX upgrade lost is a regression whose cause is the MLX version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import run_worker
from test_pull import dirs, kf  # noqa: F401 - dirs is a fixture
from test_runtime_settings import TINY, kf_here

from kernelfleet import runtime_settings_file as settings_file
from kernelfleet.chips import detect_chip
from kernelfleet.service.targets import exact_chip_pattern
from kernelfleet.worker.state import Credentials, WorkerState

pytest.importorskip("mlx_lm")


def _enrolled(coordinator: Any, chip: str, backend: str, state_dir: Path) -> str:
    """Enroll a worker for ``chip`` through the API and keep its credentials where the agent does."""
    with coordinator.admin() as admin:
        enroll = admin.post("/enroll-tokens", json={}).json()["token"]
    with coordinator.client() as anon:
        r = anon.post("/workers/enroll", json={"enrollment_token": enroll, "name": "tuner", "chip": chip,
                                               "backend": backend, "os": "Linux", "mlx_version": "0.32.4"})
        assert r.status_code == 201, r.text
    token = str(r.json()["token"])
    WorkerState(state_dir).save_credentials(Credentials(token, r.json()["worker_id"], coordinator.url))
    return token


def test_runtime_settings_reach_another_machine_through_a_job_push_and_pull(
        coordinator: Any, dirs: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    chip = detect_chip()
    state = tmp_path / "state"
    token = _enrolled(coordinator, chip.name, chip.backend, state)
    worker = {"Authorization": f"Bearer {token}"}
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    plan = {"config": TINY, "compute_dtype": "float32", "workloads": ["decode:1"], "context": 8, "steps": 2,
            "reps": 1, "rounds": 3}
    h100 = "NVIDIA H100 80GB HBM3"
    _enrolled(coordinator, h100, "cuda", tmp_path / "h100")  # enrolled, never runs here
    # the tiny Llama's runtime settings, beside one kernel job (its result makes the chip's profile):
    # the kernel job for any worker, a runtime-settings job for each enrolled chip
    with coordinator.admin() as admin:
        r = admin.post("/campaigns", json={"name": "tiny llama", "kernels": ["rmsnorm"], "shapes": ["8x64"],
                                           "dtypes": ["float32"], "runtime_settings": plan})
        assert r.status_code == 201, r.text
        campaign = r.json()["id"]
        jobs = admin.get("/jobs", params={"campaign_id": campaign}).json()
    planned = sorted((j["kind"], j["kernel"], j["shape"], j["dtype"], j["target_chip"]) for j in jobs)
    assert planned == sorted([
        ("runtime_settings", "runtime_settings", "llama h64 x2", "float32", exact_chip_pattern(chip.name)),
        ("runtime_settings", "runtime_settings", "llama h64 x2", "float32", h100),
        ("tune", "rmsnorm", "8x64", "float32", None)])

    # the runtime job's lease carries its search; a result for another model, a tuning report or
    # neither is refused (422) and the lease stays this worker's, which gives both jobs back
    with coordinator.client(token) as w:
        held = [w.post("/leases", json={}).json() for _ in range(2)]
        [job] = [g for g in held if g["kind"] == "runtime_settings"]
        assert job["runtime_settings"] == {**plan, "quantization": "bf16"}
        wrong = {"schema": settings_file.SCHEMA, "chip": chip.name, "backend": chip.backend,
                 "mlx_version": "0.32.4", "entries": [{"model": "llama h4096 x8", "dtype": "float32",
                                                       "workload": "decode:1", "settings": {}}]}
        for sent, says in (({"runtime_settings": wrong}, "searches llama h64 x2/float32"),
                           ({"report": {"kernel": "rmsnorm"}}, "report"), ({}, "give a report")):
            refused = w.post(f"/jobs/{job['job_id']}/result",
                             json={"lease_token": job["lease_token"], **sent})
            assert refused.status_code == 422 and says in refused.json()["detail"], refused.text
        for g in held:
            back = w.post(f"/jobs/{g['job_id']}/release", json={"lease_token": g["lease_token"]})
            assert back.status_code == 200, back.text

    code, log = run_worker(coordinator.url, state, "tuner", "--max-jobs", "2", "--budget", "1",
                           "--lease-wait", "0", timeout=180)
    assert code == 0, log
    assert "runtime_settings llama h64 x2 float32" in log and "decode:1 MLX defaults" in log
    with coordinator.admin() as admin:
        states = {(j["kind"], j["target_chip"]): j["state"]
                  for j in admin.get("/jobs", params={"campaign_id": campaign}).json()}
        assert states == {("tune", None): "done", ("runtime_settings", exact_chip_pattern(chip.name)): "done",
                          ("runtime_settings", h100): "queued"}  # for the H100's own worker
        got = admin.get(f"/runtime-settings/{chip.name}")
    [entry] = got.json()["entries"]
    assert (got.json()["chip"], got.json()["backend"]) == (chip.name, chip.backend)
    assert (entry["model"], entry["dtype"], entry["workload"]) == ("llama h64 x2", "float32", "decode:1")
    # this machine's search as the worker ran it: each BFS width of the grid in its own process, one round
    # (the 1 s budget), so MLX's defaults stay and the note says why
    coarse = {e["settings"]["MLX_BFS_MAX_WIDTH"]: e for e in entry["evidence"] if e["stage"] == "coarse"}
    assert sorted(coarse) == ["5", "80"]
    assert all(e["bit_identical"] and e["rounds"] == 1 for e in coarse.values())
    assert entry["settings"] == {}
    assert entry["note"] == "budget spent after 1 coarse round(s) (a verdict needs 3)"
    assert len(entry["round_gains"]) == 1  # the control's one round: too few to compare across MLX versions

    coordinator.settle(profiles=True)
    done = kf("pull", "--coordinator", coordinator.url, env=dirs)
    assert done.returncode == 0, done.stderr
    installed = Path(dirs["KERNELFLEET_PROFILE_DIR"]) / settings_file.installed_path(chip.name).name
    assert f"runtime settings: 1 entry -> {installed}" in done.stdout
    body = settings_file.read(installed)
    assert (body["chip"], body["entries"]) == (chip.name, [entry])

    # apply_settings reads the pulled file in a process that has not imported MLX: the entry matches,
    # MLX's defaults were chosen, nothing is set
    script = ("import json, sys, kernelfleet; done = kernelfleet.apply_settings(sys.argv[1], "
              "model=sys.argv[2], dtype='float32', workload='decode:1'); print(json.dumps(done)); "
              "print('mlx imported:', 'mlx.core' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", script, str(installed), str(model)], capture_output=True,
                         text=True, timeout=60, env={**dirs, "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["{}", "mlx imported: False"]

    # kernelfleet.patch says what the pulled file chose for this model (MLX is imported by then: it
    # names what to export, and sets nothing)
    import kernelfleet
    from kernelfleet.kernels.patch.model_build import build

    tiny = build(TINY, "float32", None)
    line = kernelfleet.patch(tiny).runtime_settings
    kernelfleet.unpatch(tiny)
    assert line is not None and installed.name in line and "MLX's defaults" in line
    chosen = {**body, "entries": [{**entry, "settings": {"MLX_BFS_MAX_WIDTH": "5"}}]}
    settings_file.write(chosen, installed)  # as if the search had chosen a width: the report's other branch
    line = kernelfleet.patch(tiny).runtime_settings
    kernelfleet.unpatch(tiny)
    assert line is not None and "runs without MLX_BFS_MAX_WIDTH=5" in line and "export" in line
    settings_file.write(body, installed)

    # the worker sends a file itself (`settings push`, the file as `settings tune` writes it): the same key
    # replaces the row
    pushed = {k: v for k, v in body.items() if k != "measured_at"}  # the coordinator's stamp, not the file's
    tuned = tmp_path / "tuned.settings.json"
    settings_file.write(pushed, tuned)
    r2 = kf_here("settings", "push", str(tuned), "--state-dir", str(state))
    assert r2.exit_code == 0, r2.stderr[-2000:]
    assert f"pushed 1 runtime-settings entries for {chip.name}" in r2.stdout
    with httpx.Client(base_url=coordinator.url + "/api/v1", timeout=30) as c:
        admin = {"Authorization": f"Bearer {coordinator.admin_token}"}
        got = c.get(f"/runtime-settings/{chip.name}", headers=admin)
        assert got.status_code == 200 and got.json()["entries"] == [entry]

        # another chip's settings, from this worker: refused, nothing stored for it
        other = {**pushed, "chip": "Apple M3 Max", "backend": "metal"}
        refused = c.post("/runtime-settings", json=other, headers=worker)
        assert refused.status_code == 422 and "enrolled as" in refused.json()["detail"]
        for bad in ({**pushed, "entries": []}, {**pushed, "schema": "something/2"},
                    {**pushed, "entries": [{**entry, "workload": "train:1"}]},
                    {**pushed, "entries": [{**entry, "settings": {"PATH": "/tmp"}}]},
                    {**pushed, "entries": [{**entry, "round_gains": [0.0]}]}):
            r3 = c.post("/runtime-settings", json=bad, headers=worker)
            assert r3.status_code == 422 and "detail" in r3.json(), r3.text
        assert c.post("/runtime-settings", json=pushed).status_code == 401  # a worker's token is needed
        missing = c.get("/runtime-settings/Apple M3 Max", headers=admin)
        assert missing.status_code == 404 and repr(chip.name) in missing.json()["detail"]
        again = c.get(f"/runtime-settings/{chip.name}", headers=admin)
        assert again.json()["entries"] == got.json()["entries"]

        # an MLX upgrade that loses a setting's gain beyond the noise is a regression caused by the MLX
        # version; the same loss pushed again is not raised twice, and a gain that holds raises none
        def at(version: str, settings: dict[str, str], gains: list[float]) -> dict[str, Any]:
            return {**pushed, "mlx_version": version, "entries": [
                {"model": "llama h4096 x8", "dtype": "bf16", "workload": "decode:8", "settings": settings,
                 "gain": sorted(gains)[2], "rounds": 5, "round_gains": gains}]}

        held_gain, lost = [1.2, 1.18, 1.22, 1.19, 1.21], [1.0, 0.99, 1.01, 1.0, 1.02]
        for version, settings, gains in (("0.31.0", {"MLX_BFS_MAX_WIDTH": "80"}, held_gain),
                                         ("0.32.0", {}, lost), ("0.32.0", {}, lost),
                                         ("0.33.0", {}, [1.01, 1.0, 0.99, 1.02, 1.0])):
            sent = c.post("/runtime-settings", json=at(version, settings, gains), headers=worker)
            assert sent.status_code == 201, sent.text
        found = c.get("/regressions", params={"kernel": "runtime_settings"}, headers=admin).json()
        assert len(found) == 1, found
        [reg] = found
        assert (reg["chip"], reg["shape"], reg["dtype"], reg["status"]) == (
            chip.name, "llama h4096 x8 decode:8", "bf16", "open")
        assert reg["cause"]["mlx_version"] == ["0.31.0", "0.32.0"]
        assert reg["cause"]["config_key"] == ["MLX_BFS_MAX_WIDTH=80", "MLX defaults"]
        assert reg["group_key"] == "mlx_version=0.31.0->0.32.0" and 0.15 < reg["effect"] < 0.25
    page = httpx.get(f"{coordinator.url}/regressions/{reg['id']}", headers=admin, timeout=30)
    assert page.status_code == 200 and "llama h4096 x8 decode:8" in page.text
    assert "1.20x → <b>1.00x</b>" in page.text and "/kernels/runtime_settings" not in page.text

    # the campaign's pages count the runtime job with its kernel job
    page = httpx.get(f"{coordinator.url}/campaigns/{campaign}", headers=admin, timeout=30)
    assert page.status_code == 200 and 'data-kernel="runtime_settings"' in page.text
    page = httpx.get(f"{coordinator.url}/campaigns", headers=admin, timeout=30)
    assert page.status_code == 200
    assert "1 kernels, 1 kernel shapes × 1 dtypes, MLX runtime settings × 1" in page.text

    # the chip's dashboard page lists them
    page = httpx.get(f"{coordinator.url}/chips/{chip.name}", headers=admin, timeout=30)
    assert page.status_code == 200
    table = page.text.split('id="runtime-settings"', 1)[1].split("</table>", 1)[0]
    assert 'data-workload="decode:1"' in table and entry["model"] in table

    # the CLI says why a push was refused, with a non-zero exit
    wrong_file = tmp_path / "wrong.settings.json"
    settings_file.write(other, wrong_file)
    r4 = kf_here("settings", "push", str(wrong_file), "--state-dir", str(state))
    assert r4.exit_code == 1 and "enrolled as" in r4.stderr and "Traceback" not in r4.stderr
    r4 = kf_here("settings", "push", str(wrong_file), "--state-dir", str(tmp_path / "nobody"))
    assert r4.exit_code == 2 and "no enrolled worker" in r4.stderr
