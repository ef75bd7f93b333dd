"""benchmarks/cross_chip.py: planning a cross-chip profile from one GPU's reports, cutting the jobs into
units, and scoring entries against the tuned best and the built-in (CPU only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import load

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def cc() -> Any:
    return load("cross_chip")


def entry(kernel: str, shape: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"kernel": kernel, "shape": shape, "dtype": "bfloat16", "config_key": key, "predicted": True,
            "confidence": 0.5, "score": 0.9, "basis": [], **extra}


def test_plan_jobs_time_every_config_an_entry_could_be(cc: Any) -> None:
    built = {
        "gated": {"entries": [
            entry("softmax", "4096x4096", "builtin", fallback="confidence 0.50 is below 0.80",
                  predicted_config_key="rpg=2,tg=256,vec=8"),
            entry("softmax", "1x4096", "builtin", fallback="the built-in is predicted fastest",
                  predicted_config_key="builtin"),
        ]},
        "ungated": {"entries": [
            entry("softmax", "4096x4096", "rpg=2,tg=256,vec=8", speedup=1.3),
            entry("softmax", "1x4096", "builtin", fallback="the built-in is predicted fastest"),
        ]},
        "own": {"entries": [{**entry("softmax", "4096x4096", "rpg=1,tg=256,vec=1"), "predicted": False}]},
    }
    jobs = cc.plan_jobs(built, [("softmax", "4096x4096"), ("softmax", "1x4096"), ("softmax", "16384x8192")])
    a, b, c = jobs
    assert a["profile_key"] == "builtin" and a["fallback"].startswith("confidence")
    assert a["raw_pick"] == a["ungated_key"] == "rpg=2,tg=256,vec=8"
    assert a["source_key"] == "rpg=1,tg=256,vec=1"
    assert a["configs"] == ["builtin", "rpg=2,tg=256,vec=8", "rpg=1,tg=256,vec=1"]
    assert b["configs"] == ["builtin"] and b["source_key"] is None
    # no prediction at all: the runtime would run the kernel's default config, so that is what is timed
    assert c["no_entry"] and c["profile_key"] is None and c["configs"][0] == c["default_key"] != "builtin"
    # run --kept-only times none of these: fallbacks and absent entries are not the profile's picks
    assert not any(cc.kept(j) for j in jobs)
    kept = cc.plan_jobs({"gated": {"entries": [entry("softmax", "4096x4096", "rpg=1,tg=256,vec=1")]},
                         "ungated": {}, "own": {}}, [("softmax", "4096x4096")])
    assert [cc.kept(j) for j in kept] == [True]


def test_plan_leaves_one_kernel_out(cc: Any, tmp_path: Path) -> None:
    # the H200's reports, and the same runs labelled as an H100 (its earlier results): both chips
    # measured the same seven (kernel, shape)s
    h200 = (RESULTS / "h200_tuning.jsonl").read_text().splitlines()
    (tmp_path / "h200_tuning.jsonl").write_text("\n".join(h200) + "\n")
    relabelled = [json.loads(line) for line in h200]
    for r in relabelled:
        r["env"]["chip"] = H100
    (tmp_path / "h100_cross_chip_tuning.jsonl").write_text("".join(json.dumps(r) + "\n" for r in relabelled))
    (tmp_path / "h100_notes.txt").write_text("not a report\n")
    assert [p.name for p in cc.source_files(tmp_path)] == [
        "h100_cross_chip_tuning.jsonl", "h200_tuning.jsonl"]
    out = tmp_path / "jobs.jsonl"
    assert cc.plan("h100", out, tmp_path) == 0
    meta, jobs = cc.read_jobs(out)
    assert meta["source"] == H200 and meta["target"] == H100
    assert meta["stored"] == {H200: 7, H100: 7}
    # every entry is predicted: each kernel's were built without the H100's results for that kernel
    assert meta["counts"]["measured"] == 0 and len(jobs) == len(cc.catalog_entries())  # 62 on 2026-11-27
    measured = {(r["kernel"], r["shape"]) for r in relabelled}
    for job in jobs:
        if (job["kernel"], job["shape"]) in measured:
            # the H200's own entry, taken as a transfer (no H100 result of that kernel in its fold)
            assert job["raw_pick"] == job["source_key"] and job["basis"][0]["chip"] == H200
    # kernels neither chip ran have no source: no entry, the runtime's default config is timed
    assert all(j.get("no_entry") for j in jobs if j["kernel"] == "rmsnorm")
    # each fold calibrates on the transfers of the other kernels, both ways: 2 per shared series
    transfers = {k: sum(b["n"] for b in f["bins"] if b["mode"] == "transfer")
                 for k, f in meta["folds"].items()}
    assert transfers["rope"] == 2 * 6 and transfers["rmsnorm"] == 2 * 7
    # with no H100 result at all, nothing is calibrated for transfers: every entry falls back
    assert meta["cold"]["counts"]["predicted"] == 0


def test_gpu_units_share_compiled_code(cc: Any) -> None:
    jobs = [{"kernel": "rope", "shape": s, "dtype": "bfloat16", "configs": ["builtin"]}
            for s in ("32x1x128", "32x32x128", "512x2048x128", "32x4096x128")]
    jobs += [{"kernel": "rmsnorm", "shape": s, "dtype": "bfloat16", "configs": ["builtin"]}
             for s in ("1x4096", "16384x8192")]
    units = cc.gpu_units(jobs)
    # rope's four shapes share one compiled unit; rmsnorm's two row lengths make two
    assert sorted((u["id"], len(u["jobs"])) for u in units) == [
        ("rmsnorm-16384x8192", 1), ("rmsnorm-1x4096", 1), ("rope-32x1x128", 4)]
    # the longest compile goes first (the catalog's spaces decide the costs)
    assert [(u["cost"], u["id"]) for u in units] == sorted(((u["cost"], u["id"]) for u in units),
                                                           key=lambda c: (-c[0], c[1]))
    assert [u["order"] for u in units] == [0, 1, 2] and {u["peers"] for u in units} == {3}


def timed(**medians: float) -> dict[str, Any]:
    """Side-by-side results: 200 rounds around each median, +-1 %."""
    return {k: {"status": "ok", "median_us": m, "p10_us": m * 0.99, "p90_us": m * 1.01, "n": 200,
                "samples_us": [m * (1 + 0.01 * ((i % 21) - 10) / 10) for i in range(200)]}
            for k, m in medians.items()}


def job(**extra: Any) -> dict[str, Any]:
    return {"kernel": "softmax", "shape": "4096x4096", "dtype": "bfloat16", "profile_key": "a",
            "fallback": None, "confidence": 0.9, "score": 0.95, "raw_pick": "a", "ungated_key": "a",
            "source_key": None, **extra}


def result(best: str, **medians: float) -> dict[str, Any]:
    return {"kernel": "softmax", "shape": "4096x4096", "dtype": "bfloat16", "chip": H200, "tuned_best": best,
            "rounds": 200, "timed": timed(**medians)}


def test_score_entry_within_and_slower_than_the_builtin(cc: Any) -> None:
    hit = cc.score_entry(job(), result("t", t=100.0, a=104.0, builtin=101.0))
    assert hit["within"] and hit["ratio"] == pytest.approx(1.04) and hit["kind"] == "large"
    assert not hit["slower"]  # 3 % above the built-in: inside the noise floor
    slow = cc.score_entry(job(), result("t", t=100.0, a=112.0, builtin=100.0))
    assert not slow["within"] and slow["slower"] and slow["vs_builtin"][1] > 1.0
    same = cc.score_entry(job(profile_key="t", ungated_key="t"), result("t", t=100.0, builtin=150.0))
    assert same["ratio"] == 1.0 and same["within"]
    fallback = cc.score_entry(job(profile_key="builtin", fallback="confidence 0.50 is below 0.80"),
                              result("t", t=100.0, a=100.0, builtin=130.0))
    assert fallback["entry_us"] == 130.0 and not fallback["within"] and not fallback["slower"]
    assert cc.score_entry(job(), None)["skipped"] == "not run"


def test_paired_interval_brackets_the_ratio(cc: Any) -> None:
    a = [110.0 + (i % 7) for i in range(200)]
    b = [100.0 + (i % 7) for i in range(200)]
    lo, hi = cc.paired_ratio_interval(a, b)
    assert 1.0 < lo <= 113.0 / 103.0 <= hi < 1.2


def test_score_reports_fallback_share_and_both_runs(cc: Any, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    meta = {"type": "meta", "target": H200, "source": H100, "threshold": 0.8, "counts": {},
            "folds": {"softmax": {"samples": 2, "bins": [{"mode": "transfer", "lo": 0.9, "hi": 1.0, "n": 2,
                                                           "hits": 2, "rate": 0.75}]}}}
    fell = job(shape="1x4096", profile_key="builtin", fallback="the built-in is predicted fastest",
               raw_pick="builtin", ungated_key="builtin")
    lines = [meta, {"type": "job", **job()}, {"type": "job", **fell}]
    jobs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    runs = []
    for i, a in enumerate((103.0, 120.0)):
        path = tmp_path / f"run{i}.jsonl"
        rows = [result("t", t=100.0, a=a, builtin=140.0),
                {**result("builtin", builtin=20.0), "shape": "1x4096"}]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(path)
    text = cc.score(jobs, runs, tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == text
    assert "fell back to the built-in: 1/2 = 50.0%" in text
    assert "non-fallback entries within 5% of the tuned best: 1/1 = 100.0%" in text  # run 1
    assert "non-fallback entries within 5% of the tuned best: 0/1 = 0.0%" in text  # run 2
    assert "ungated picks whose within-5% verdict differs: softmax 4096x4096 +3.0% vs +20.0%" in text
    assert "device: NVIDIA H200" in text
    assert "  softmax                    2    2   2 -> 0.75" in text
