"""MLX's runtime settings through the fleet, end to end with a real coordinator and real MLX: a
worker enrolled for this machine's chip tunes them (`kernelfleet settings tune`, each setting in
its own process), pushes the file (`kernelfleet settings push`, the worker's own token), and
`kernelfleet pull` on the same chip installs it beside the profile, where
`kernelfleet.apply_settings` reads it before MLX starts. A push for another chip, a malformed file
and an unknown chip get clear 4xx answers, and nothing stored changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_pull import dirs, kf, post_through_leases  # noqa: F401 - dirs is a fixture
from test_runtime_settings import kf_here, tune_tiny

from kernelfleet import runtime_settings_file as settings_file
from kernelfleet.chips import detect_chip
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


def test_tuned_settings_reach_another_machine_through_push_and_pull(
        coordinator: Any, dirs: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    chip = detect_chip()
    state = tmp_path / "state"
    token = _enrolled(coordinator, chip.name, chip.backend, state)

    model, tuned = tmp_path / "tiny.json", tmp_path / "tuned.settings.json"
    tune_tiny(model, tuned)
    pushed = settings_file.read(tuned)
    assert pushed["chip"] == chip.name

    r = kf_here("settings", "push", str(tuned), "--state-dir", str(state))
    assert r.exit_code == 0, r.stderr[-2000:]
    assert f"pushed 1 runtime-settings entries for {chip.name}" in r.stdout

    # the chip needs a profile to pull: results of this chip, stored through leases
    post_through_leases(coordinator, chip.name, chip.backend, ["4096x4096"], np.random.default_rng(3))
    coordinator.settle(profiles=True)
    done = kf("pull", "--coordinator", coordinator.url, env=dirs)
    assert done.returncode == 0, done.stderr
    installed = Path(dirs["KERNELFLEET_PROFILE_DIR"]) / settings_file.installed_path(chip.name).name
    assert f"runtime settings: 1 entry -> {installed}" in done.stdout
    body = settings_file.read(installed)
    assert (body["chip"], body["backend"], body["mlx_version"]) == (chip.name, chip.backend,
                                                                    pushed["mlx_version"])
    [entry] = body["entries"]
    [tuned_entry] = pushed["entries"]
    for field in ("model", "dtype", "workload", "settings", "gain", "note", "evidence"):
        assert entry[field] == tuned_entry[field], field

    # apply_settings reads the pulled file in a process that has not imported MLX
    script = ("import json, os, sys, kernelfleet; done = kernelfleet.apply_settings(sys.argv[1], "
              "model=sys.argv[2], workload='decode:1'); print(json.dumps(done)); "
              "print('mlx imported:', 'mlx.core' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", script, str(installed), str(model)], capture_output=True,
                         text=True, timeout=60, env={**dirs, "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[0]) == entry["settings"]
    assert "mlx imported: False" in ran.stdout

    # kernelfleet.patch says what the pulled file chose for this model (MLX is imported by then: it
    # names what to export, and sets nothing)
    import kernelfleet
    from kernelfleet.kernels.patch.model_build import build

    tiny = build(json.loads(model.read_text()), "float32", None)
    line = kernelfleet.patch(tiny).runtime_settings
    kernelfleet.unpatch(tiny)
    assert line is not None and installed.name in line
    if not entry["settings"]:
        assert "MLX's defaults" in line
    chosen = {**body, "entries": [{**entry, "settings": {"MLX_BFS_MAX_WIDTH": "5"}}]}
    settings_file.write(chosen, installed)  # as if the search had chosen a width: the report's other branch
    line = kernelfleet.patch(tiny).runtime_settings
    kernelfleet.unpatch(tiny)
    assert line is not None and "runs without MLX_BFS_MAX_WIDTH=5" in line and "export" in line
    settings_file.write(body, installed)

    # a second push of the same key replaces the row: one entry per (model, dtype, workload)
    r = kf_here("settings", "push", str(tuned), "--state-dir", str(state))
    assert r.exit_code == 0, r.stderr[-2000:]
    with httpx.Client(base_url=coordinator.url + "/api/v1", timeout=30) as c:
        admin = {"Authorization": f"Bearer {coordinator.admin_token}"}
        got = c.get(f"/runtime-settings/{chip.name}", headers=admin)
        assert got.status_code == 200 and len(got.json()["entries"]) == 1

        # another chip's settings, from this worker: refused, nothing stored for it
        other = {**pushed, "chip": "Apple M3 Max", "backend": "metal"}
        refused = c.post("/runtime-settings", json=other, headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 422 and "enrolled as" in refused.json()["detail"]
        for bad in ({**pushed, "entries": []}, {**pushed, "schema": "something/2"},
                    {**pushed, "entries": [{**tuned_entry, "workload": "train:1"}]},
                    {**pushed, "entries": [{**tuned_entry, "settings": {"PATH": "/tmp"}}]}):
            r2 = c.post("/runtime-settings", json=bad, headers={"Authorization": f"Bearer {token}"})
            assert r2.status_code == 422 and "detail" in r2.json(), r2.text
        assert c.post("/runtime-settings", json=pushed).status_code == 401  # a worker's token is needed
        missing = c.get("/runtime-settings/Apple M3 Max", headers=admin)
        assert missing.status_code == 404 and repr(chip.name) in missing.json()["detail"]
        again = c.get(f"/runtime-settings/{chip.name}", headers=admin)
        assert again.json()["entries"] == got.json()["entries"]

    # the chip's dashboard page lists them
    page = httpx.get(f"{coordinator.url}/chips/{chip.name}", headers=admin, timeout=30)
    assert page.status_code == 200
    table = page.text.split('id="runtime-settings"', 1)[1].split("</table>", 1)[0]
    assert 'data-workload="decode:1"' in table and entry["model"] in table

    # the CLI says why a push was refused, with a non-zero exit
    wrong = tmp_path / "wrong.settings.json"
    settings_file.write(other, wrong)
    r = kf_here("settings", "push", str(wrong), "--state-dir", str(state))
    assert r.exit_code == 1 and "enrolled as" in r.stderr and "Traceback" not in r.stderr
    r = kf_here("settings", "push", str(wrong), "--state-dir", str(tmp_path / "nobody"))
    assert r.exit_code == 2 and "no enrolled worker" in r.stderr
