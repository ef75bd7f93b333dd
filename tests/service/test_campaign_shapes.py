"""Per-kernel shape sets in campaigns (``kernel_shapes``), over the real API, and
``kernelfleet admin campaign create --from-model`` against a real coordinator."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from conftest import Coordinator
from test_serve_cli import run_cli

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"


def jobs(coordinator: Coordinator, campaign_id: int) -> list[dict[str, Any]]:
    with coordinator.admin() as c:
        r = c.get("/jobs", params={"campaign_id": campaign_id, "limit": 1000})
        assert r.status_code == 200, r.text
        return r.json()


def test_each_kernel_gets_its_own_shapes(coordinator: Coordinator) -> None:
    sets = {"rmsnorm": ["1x4096", "512x4096"], "rope": ["32x1x128", "8x512x128"], "softmax": ["8x4096"]}
    with coordinator.admin() as c:
        # the same kernels as kernels x shapes: rope refuses the row kernels' shapes, and the reverse
        crossed = c.post("/campaigns", json={"name": "x", "kernels": list(sets),
                                             "shapes": sorted({s for v in sets.values() for s in v}),
                                             "dtypes": ["bfloat16"]})
        assert crossed.status_code == 422 and "rope" in crossed.json()["detail"]
        r = c.post("/campaigns", json={"name": "model", "kernel_shapes": sets,
                                       "dtypes": ["bfloat16", "float16"]})
        assert r.status_code == 201, r.text
        body = r.json()
    assert body["kernel_shapes"] == sets and body["kernels"] == list(sets)
    assert body["shapes"] == ["1x4096", "512x4096", "32x1x128", "8x512x128", "8x4096"]
    assert body["progress"]["total"] == 5 * 2
    got = Counter((j["kernel"], j["shape"]) for j in jobs(coordinator, body["id"]))
    assert got == Counter({(k, s): 2 for k, v in sets.items() for s in v})
    page = httpx.get(coordinator.url + "/campaigns", timeout=30)  # the dashboard's campaigns page
    assert page.status_code == 200 and "3 kernels, 5 kernel shapes × 2 dtypes" in page.text
    with coordinator.admin() as c:
        listed = c.get("/campaigns").json()
        assert listed[0]["kernel_shapes"] == sets
        # the older form still works, and reads back as every kernel at every shape
        old = c.post("/campaigns", json={"name": "old", "kernels": ["rmsnorm", "softmax"],
                                         "shapes": ["8x4096"], "dtypes": ["float16"]})
        assert old.status_code == 201 and old.json()["kernel_shapes"] == {"rmsnorm": ["8x4096"],
                                                                          "softmax": ["8x4096"]}


BAD = [
    ({"kernel_shapes": {"rmsnorm": ["8x64"]}, "kernels": ["rmsnorm"], "shapes": ["8x64"]}, "not both"),
    ({"kernels": ["rmsnorm"]}, "give kernels and shapes, or kernel_shapes"),
    ({"kernel_shapes": {}}, "kernel_shapes"),
    ({"kernel_shapes": {"rmsnorm": []}}, "kernel_shapes.rmsnorm"),
    ({"kernel_shapes": {"rmsnorm": ["8x64", "8x64"]}}, "kernel_shapes['rmsnorm'] lists the same value twice"),
    ({"kernel_shapes": {"rope": ["8x64"]}}, "kernel 'rope', shape '8x64'"),
    ({"kernel_shapes": {"nope": ["8x64"]}}, "unknown kernel 'nope'"),
    ({"kernel_shapes": {"Bad Name": ["8x64"]}}, "kernel_shapes"),
    ({"kernel_shapes": {"rmsnorm": ["8x64x"]}}, "kernel_shapes"),
    ({"kernel_shapes": {f"k{i}": ["8x64"] for i in range(65)}}, "kernel_shapes"),
]


def test_bad_shape_sets_are_422(coordinator: Coordinator) -> None:
    with coordinator.admin() as c:
        for body, detail in BAD:
            r = c.post("/campaigns", json={"name": "x", "dtypes": ["float16"], **body})
            assert r.status_code == 422, (body, r.text)
            assert detail in str(r.json()["detail"]), (body, r.json())
        assert c.get("/campaigns").json() == []
        # the bound on jobs is on the total over every kernel's shapes
        many = {k: [f"{i + 1}x64" for i in range(64)] for k in ("rmsnorm", "softmax")}
        r = c.post("/campaigns", json={"name": "x", "dtypes": ["float16"], "kernel_shapes": many})
        assert r.status_code == 201 and r.json()["progress"]["total"] == 128


def test_admin_cli_from_model(coordinator: Coordinator) -> None:
    env = {"KERNELFLEET_ADMIN_TOKEN": coordinator.admin_token}
    base = ("--coordinator", coordinator.url)
    r = run_cli("admin", "campaign", "create", "--from-model", str(MODELS / "qwen3-30b-a3b.json"),
                "--backend", "cuda", *base, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    # the plan comes first, then the queueing
    assert out.index("plan: 6 kernels") < out.index("43 jobs queued for cuda")
    assert "experts 128" in out and "topk_gating_softmax" in out and "note: topk_gating_softmax" in out
    with coordinator.admin() as c:
        campaign = c.get("/campaigns").json()[0]
    assert campaign["name"] == "qwen3_moe (models)"
    assert campaign["kernel_shapes"]["moe_combine"] == ["1x8x2048", "8x8x2048", "32x8x2048", "512x8x2048",
                                                       "2048x8x2048"]
    assert len(jobs(coordinator, campaign["id"])) == 43

    r = run_cli("admin", "campaign", "create", "--from-model", str(MODELS / "llama-3-8b.json"),
                "--decode", "1", "--prefill", "128", "--dtype", "float16", "--dtype", "bfloat16",
                "--name", "llama small", "--dry-run", *base, env=env)
    assert r.returncode == 0, r.stderr
    assert "= 20 jobs" in r.stdout and "dry run: nothing queued" in r.stdout

    r = run_cli("admin", "campaign", "create", "--name", "sets", "--kernel-shape", "rope=32x1x128",
                "--kernel-shape", "rmsnorm=1x4096", "--kernel-shape", "rope=8x1x128", "--dtype", "bfloat16",
                *base, env=env)
    assert r.returncode == 0 and "3 jobs queued" in r.stdout, r.stderr
    with coordinator.admin() as c:
        assert len(c.get("/campaigns").json()) == 2  # the dry run queued nothing


REFUSED = [
    (("--from-model", str(MODELS / "gpt2.json")),
     "architecture 'gpt2' is not mapped onto catalog kernels (mapped: gemma3_text, llama, mistral, mixtral, "
     "qwen2, qwen3, qwen3_moe); fields that could not be mapped: n_embd, n_head, n_layer"),
    (("--from-model", "/nonexistent/config.json"), "no such file"),
    (("--from-model", str(MODELS / "llama-3-8b.json"), "--kernel", "rmsnorm"), "drop --kernel"),
    (("--from-model", str(MODELS / "llama-3-8b.json"), "--prefill", "0"), "token counts must be positive"),
    (("--name", "x", "--kernel-shape", "rope", "--dtype", "float16"), "expected KERNEL=SHAPE"),
    (("--name", "x", "--kernel", "rmsnorm", "--dtype", "float16"), "--kernel and --shape go together"),
    # checked before the plan, named by the option (tests/service/test_campaign_validation.py)
    (("--name", "x", "--kernel-shape", "rope=8x64", "--dtype", "float16"),
     "--kernel-shape rope=8x64: rope: expected a rank-3 shape"),
]


def test_admin_cli_refusals_are_clear(coordinator: Coordinator) -> None:
    for args, message in REFUSED:
        r = run_cli("admin", "campaign", "create", *args, "--coordinator", coordinator.url,
                    env={"KERNELFLEET_ADMIN_TOKEN": coordinator.admin_token})
        assert r.returncode == 1 and message in " ".join(r.stderr.split()), (args, r.stderr)
        assert "Traceback" not in r.stderr
    with coordinator.admin() as c:
        assert c.get("/campaigns").json() == []
