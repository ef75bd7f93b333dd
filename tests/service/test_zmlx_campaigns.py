"""Campaigns for zmlx's kernels (Metal-only custom kernels) target Metal: a CUDA worker is never
leased one, a Metal worker is; naming another backend, or a non-Metal chip, is a clear 422."""

from __future__ import annotations

from typing import Any


def enroll(coordinator: Any, admin: Any, chip: str, backend: str) -> str:
    token = admin.post("/enroll-tokens", json={}).json()["token"]
    with coordinator.client() as anon:
        r = anon.post("/workers/enroll", json={"enrollment_token": token, "name": chip, "chip": chip,
                                                "backend": backend, "os": "test", "mlx_version": "0.32.4"})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def test_a_zmlx_campaign_targets_metal(coordinator: Any) -> None:
    with coordinator.admin() as admin:
        r = admin.post("/campaigns", json={"name": "zmlx norms", "kernels": ["zmlx_rmsnorm", "rmsnorm"],
                                           "shapes": ["1x4096"], "dtypes": ["float16"]})
        assert r.status_code == 201, r.text
        campaign = admin.get(f"/campaigns/{r.json()['id']}").json()
        assert campaign["target_backend"] == "metal"
        cuda = enroll(coordinator, admin, "NVIDIA H100 80GB HBM3", "cuda")
        metal = enroll(coordinator, admin, "Apple M3 Max", "metal")
    with coordinator.client(cuda) as worker:
        assert worker.post("/leases", json={}).status_code == 204
    with coordinator.client(metal) as worker:
        leased = {worker.post("/leases", json={}).json()["kernel"] for _ in range(2)}
    assert leased == {"zmlx_rmsnorm", "rmsnorm"}


def test_another_backend_or_chip_is_refused(coordinator: Any) -> None:
    base = {"name": "zmlx", "kernels": ["zmlx_swiglu"], "shapes": ["1x14336"], "dtypes": ["bfloat16"]}
    with coordinator.admin() as admin:
        r = admin.post("/campaigns", json={**base, "target_backend": "cuda"})
        assert r.status_code == 422
        assert "zmlx_swiglu runs on metal" in str(r.json()["detail"])
        r = admin.post("/campaigns", json={**base, "target_chip": "NVIDIA H200"})
        assert r.status_code == 422
        assert "'NVIDIA H200' is not a metal chip" in str(r.json()["detail"])
        ok = admin.post("/campaigns", json={**base, "target_chip": "Apple M3*"})
        assert ok.status_code == 201 and ok.json()["target_backend"] == "metal"
        assert admin.get("/campaigns").json()[0]["target_backend"] == "metal"
