"""A runtime-settings campaign and chips that enroll after it (SQLite and PostgreSQL, a real coordinator):
each chip's first worker gets the campaign's runtime-settings jobs for its chip, whether the campaign
was made with no worker enrolled (its jobs on the campaign's own target move to the first chip) or
for other chips; a second worker of a chip, a chip outside the campaign's target, a cancelled
campaign and a campaign without runtime settings get nothing; the new chip's worker leases its job."""

from __future__ import annotations

from typing import Any

from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll

from kernelfleet.service.targets import exact_chip_pattern

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
        "rope_theta": 500000.0, "tie_word_embeddings": False}
PLAN = {"config": TINY, "compute_dtype": "float32", "quantizations": ["bf16", "4bit"],
        "workloads": ["decode:1"], "context": 8, "steps": 2, "reps": 1, "rounds": 3}
DTYPES = ("4bit float32", "float32")  # a job per quantization, labelled as the jobs list shows it
M2, H100, A100 = "Apple M2", "NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB"


def runtime_jobs(c: Coordinator, campaign: int) -> list[tuple[Any, ...]]:
    with c.admin() as admin:
        jobs = admin.get("/jobs", params={"campaign_id": campaign}).json()
    return sorted((j["target_backend"], j["target_chip"], j["shape"], j["dtype"], j["state"])
                  for j in jobs if j["kind"] == "runtime_settings")


def campaign(c: Coordinator, name: str, **extra: Any) -> int:
    return int(create_campaign(c, name=name, shapes=["8x64"], dtypes=["float32"], **extra)["id"])


def test_chips_enrolled_after_a_runtime_settings_campaign_get_its_jobs(coordinator: Coordinator) -> None:
    c = coordinator
    model = "llama h64 x2"
    anyone = campaign(c, "any chip", runtime_settings=PLAN)  # no worker yet: one job per quantization
    assert runtime_jobs(c, anyone) == [(None, None, model, d, "queued") for d in DTYPES]
    cuda_only = campaign(c, "cuda chips", runtime_settings=PLAN, target_backend="cuda")
    cancelled = campaign(c, "cancelled", runtime_settings=PLAN)
    plain = campaign(c, "no runtime settings")
    with c.admin() as admin:
        assert admin.post(f"/campaigns/{cancelled}/cancel").status_code == 200

    enroll(c, "mini", M2, "metal")  # the first chip takes the campaign's own jobs
    m2 = [("metal", exact_chip_pattern(M2), model, d, "queued") for d in DTYPES]
    assert runtime_jobs(c, anyone) == m2
    assert runtime_jobs(c, cuda_only) == [("cuda", None, model, d, "queued") for d in DTYPES]

    _, h100_token = enroll(c, "gpu", H100, "cuda")  # a second chip gets jobs of its own
    h100 = [("cuda", H100, model, d, "queued") for d in DTYPES]
    assert runtime_jobs(c, anyone) == sorted(m2 + h100)
    assert runtime_jobs(c, cuda_only) == h100  # the cuda campaign's own jobs moved to the H100

    enroll(c, "mini-2", M2, "metal")  # another worker of a known chip: nothing new
    enroll(c, "gpu-2", A100, "cuda")
    a100 = [("cuda", A100, model, d, "queued") for d in DTYPES]
    assert runtime_jobs(c, anyone) == sorted(m2 + h100 + a100)
    assert runtime_jobs(c, cuda_only) == sorted(h100 + a100)
    assert all(state == "cancelled" for *_, state in runtime_jobs(c, cancelled))
    assert len(runtime_jobs(c, cancelled)) == 2 and runtime_jobs(c, plain) == []

    # the H100's worker leases everything it may run: its chip's runtime jobs and the kernel jobs of the
    # campaigns not cancelled; the other chips' runtime jobs stay queued for them
    with c.client(h100_token) as w:
        leases = [w.post("/leases", json={}) for _ in range(8)]
    assert [r.status_code for r in leases] == [200] * 7 + [204], [r.text for r in leases]
    with c.admin() as admin:
        jobs = {j["id"]: j for j in admin.get("/jobs").json()}
    held = [jobs[r.json()["job_id"]] for r in leases[:7]]
    assert sorted((j["kind"], j["target_chip"]) for j in held) == [("runtime_settings", H100)] * 4 + [
        ("tune", None)] * 3
    assert {j["state"] for j in jobs.values() if j["kind"] == "runtime_settings"
            and j["target_chip"] != H100 and j["campaign_id"] != cancelled} == {"queued"}
