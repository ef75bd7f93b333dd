"""benchmarks/session.py: how the multi-GPU session cuts the catalog into units, how units take
turns, and how the combined report keeps disturbed units out of its figures (CPU only)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

SESSION = Path(__file__).parents[2] / "benchmarks" / "session.py"


@pytest.fixture(scope="module")
def session() -> Any:
    spec = importlib.util.spec_from_file_location("kf_bench_session", SESSION)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
