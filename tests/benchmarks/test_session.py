"""benchmarks/session.py: how the multi-GPU session cuts the catalog into units, how units take
turns, and how the combined report keeps disturbed units out of its figures (CPU only)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from . import load


@pytest.fixture(scope="module")
def session() -> Any:
    return load("session")


def test_units_share_compiled_code(session: Any) -> None:
    per_gpu = session.plan(2, ["rmsnorm", "rope"], "bfloat16")
    units = {u["id"]: u for gpu in per_gpu for u in gpu}
    # rmsnorm: the row length is a template value, so 4096 and 8192 are two units
    assert units["rmsnorm-1x4096"]["shapes"] == ["1x4096", "32x4096", "4096x4096"]
    assert units["rmsnorm-16384x8192"]["shapes"] == ["16384x8192"]
    assert units["rmsnorm-16384x8192"]["primary"] and not units["rmsnorm-1x4096"]["primary"]
    # rope: only the head dim is, so one unit holds all four shapes (and the first large one)
    assert units["rope-32x1x128"]["shapes"] == ["32x1x128", "32x32x128", "512x2048x128", "32x4096x128"]
    assert units["rope-32x1x128"]["primary"]
    assert sorted(len(gpu) for gpu in per_gpu) == [1, 2]


def test_turns_run_in_order_after_every_unit_compiled(session: Any, tmp_path: Path) -> None:
    deadline = time.time() + 30
    first = session.Turns(tmp_path, 0, 0, 2, 2, deadline)
    second = session.Turns(tmp_path, 0, 1, 2, 2, deadline)
    for t in (first, second):
        t.done(0)
    first.wait(1)  # every unit compiled: the first unit's turn
    assert not first.late
    (tmp_path / "pid.0.0").write_text(str(os.getpid()))  # the predecessor is alive: wait for its marker
    first.done(1)
    second.wait(1)
    assert not second.late
    # a turn whose predecessor never ends starts at the deadline, flagged late
    late = session.Turns(tmp_path / "x", 0, 1, 2, 2, time.time() + 0.5)
    (tmp_path / "x" / "pid.0.0").write_text(str(os.getpid()))
    late.wait(1)
    assert late.late


def test_merge_sets_disturbed_units_apart(session: Any, tmp_path: Path) -> None:
    def row(unit: str, type_: str, late: bool = False, **payload: Any) -> str:
        return json.dumps({"type": type_, "unit": unit, "gpu": 0, "late": late, **payload})

    def table(kernel: str, shape: str, tuned_us: float) -> dict[str, Any]:
        return {"kernel": kernel, "kind": "large", "shape": shape, "dtype": "bfloat16",
                "builtin_us": 2 * tuned_us, "tuned_us": tuned_us, "speedup": 2.0, "best": "tg=256",
                "builtin_gbs": 1000.0, "tuned_gbs": 2000.0, "pct_copy": 99.0, "candidates": 25, "ok": 25}

    (tmp_path / "gpu_a.jsonl").write_text("\n".join([
        row("a", "copy", copy_gbs={"limit": 2500.0}),
        row("a", "table", **table("rmsnorm", "16384x8192", 100.0)),
        row("a", "spread", late=True, shape="8x8192"),  # a late spread turn runs nothing: "a" stays
    ]) + "\n")
    (tmp_path / "gpu_b.jsonl").write_text("\n".join([
        row("b", "copy", copy_gbs={"limit": 1000.0}),  # below 80 % of the GPU's best: disturbed
        row("b", "table", **table("softmax", "16384x8192", 50.0)),
    ]) + "\n")
    text = session.merge(tmp_path, "gpu")
    summary, apart = text.split("## disturbed units")
    assert "rmsnorm" in summary and "softmax" not in summary
    assert "over 1 shapes" in summary and "80%" in summary  # 2000 / 2500 GB/s, the GPU's best copy
    assert "softmax" in apart and ": b;" in apart


def test_job_units_group_jobs_by_compiled_code(session: Any) -> None:
    jobs = [{"chip": "c", "kernel": "rmsnorm", "shape": s, "dtype": "bfloat16", "configs": c} for s, c in [
        ("256x4096", ["rpg=1,tg=256,vec=8", "builtin"]),
        ("2048x4096", ["rpg=2,tg=512,vec=8", "rpg=1,tg=256,vec=8"]),
        ("256x8192", ["builtin", "rpg=1,tg=512,vec=8"]),
    ]]
    per_gpu = session.plan(1, [], "bfloat16", jobs=jobs)
    units = {u["id"]: u for u in per_gpu[0]}
    # the row count does not change the compiled code: one unit per row length
    assert units["rmsnorm-bfloat16-x4096-jobs"]["shapes"] == ["256x4096", "2048x4096"]
    assert units["rmsnorm-bfloat16-x4096-jobs"]["cost"] == 3  # distinct configs to compile
    assert [j["shape"] for j in units["rmsnorm-bfloat16-x8192-jobs"]["jobs"]] == ["256x8192"]


def test_job_pass_times_each_job_side_by_side(session: Any, tmp_path: Path) -> None:
    """A job unit's pass 3 on this CPU: the built-in is timed, a custom config the backend cannot run
    is recorded as None (failed), and each job becomes one side_by_side row."""
    job = {"chip": "cpu", "kernel": "rmsnorm", "shape": "8x256", "dtype": "float32",
           "configs": ["rpg=1,tg=32,vec=4", "builtin"]}
    unit = {**session.plan(1, [], "float32", jobs=[job])[0][0], "gpu": 0, "order": 0, "peers": 1, "units": 1}
    turns = session.Turns(tmp_path / "turns", 0, 0, 1, 1, time.time() + 60)
    session.run_unit(unit, turns, tmp_path, "cpu", [3])
    rows = [json.loads(line) for line in (tmp_path / f"cpu_{unit['id']}.jsonl").read_text().splitlines()]
    assert [r["type"] for r in rows] == ["side_by_side"]
    medians = rows[0]["medians"]
    assert medians["rpg=1,tg=32,vec=4"] is None and medians["builtin"] > 0
    assert rows[0]["shape"] == "8x256" and rows[0]["chip"] == "cpu"


def test_repeat_lines_give_reported_and_side_by_side_figures(session: Any) -> None:
    repeats = [
        {"kernel": "geglu", "shape": "16384x8192", "pick1": "a", "us1": 300.0, "pick2": "b", "us2": 312.0,
         "diff": 0.04, "side": 0.005},
        {"kernel": "rope", "shape": "512x2048x128", "pick1": "c", "us1": 210.0, "pick2": "c", "us2": 211.0,
         "diff": 1 / 210, "side": 0.0},
    ]
    text = "\n".join(session.repeat_lines(repeats))
    assert "reported medians differ  4.00%, side by side 0.50%" in text
    assert "picks within 3%, reported medians: 1/2; worst 4.00%" in text
    assert "picks within 3%, side by side: 2/2; worst 0.50%" in text


def test_search_table_gives_both_quality_figures(session: Any) -> None:
    def row(kernel: str, quality: float, referee: float | None) -> dict[str, Any]:
        return {"kernel": kernel, "shape": "16384x8192", "dtype": "bfloat16", "candidates": 61,
                "ex_best": "a", "ex_best_us": 100.0, "hv_best": "b", "hv_best_us": 101.0, "quality": quality,
                "referee": referee, "hv_s": 0.5, "ex_s": 2.0, "time_ratio": 0.25, "whole_ratio": 0.5}

    # exhaustive's own medians call geglu's pick 4.6 % slower; timed side by side it is 1 % faster
    text = session.sb.table([row("geglu", 1.046, 0.99), row("swiglu", 1.0, 1.0), row("rope", 1.01, None)])
    assert "(exhaustive's own timings): 2/3; worst pick/best 1.046" in text
    assert "(the two picks side by side): 2/2; worst 1.000" in text  # a failed referee is left out
    assert "        -" in text.splitlines()[3]
