"""benchmarks/predict.py: side-by-side jobs for held-out shapes and their scoring (CPU only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import load

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def predict() -> Any:
    return load("predict")


def row(shape: str, pick: str, best: str, chip: str = H100, default: str = "tg=256") -> dict[str, Any]:
    return {"key": (chip, "softmax", shape, "bfloat16"), "pick": pick, "best_key": best,
            "default_key": default}


def within(ratios: list[float | None]) -> str:
    hits = sum(1 for r in ratios if r is not None and r <= 1.05)
    return f"{hits}/{len(ratios)}"


def test_jobs_only_where_the_pick_is_not_the_tuned_best(predict: Any) -> None:
    rows = [row("1x4096", "builtin", "builtin"), row("64x4096", "tg=128", "tg=512"),
            row("64x4096", "tg=128", "tg=512", chip="NVIDIA H200"), row("8x4096", "tg=256", "builtin")]
    jobs = predict.side_by_side_jobs(rows, "H100")
    assert [(j["shape"], j["configs"]) for j in jobs] == [
        ("64x4096", ["tg=512", "tg=128", "tg=256", "builtin"]),  # tuned best first, no duplicates
        ("8x4096", ["builtin", "tg=256"]),
    ]
    assert all(j["chip"] == H100 for j in jobs)


def test_side_by_side_scores_against_the_tuned_best_of_the_same_measurement(predict: Any,
                                                                            tmp_path: Path) -> None:
    rows = [row("1x4096", "builtin", "builtin"),  # the pick is the tuned best: 1.0, no job
            row("64x4096", "tg=128", "tg=512"),    # 4 % slower side by side: a hit
            row("256x4096", "tg=128", "tg=512"),   # 20 % slower: a miss
            row("512x4096", "tg=128", "tg=512")]   # never timed: left out, and said so
    results = tmp_path / "sbs.jsonl"
    results.write_text("".join(json.dumps({"chip": H100, "kernel": "softmax", "shape": s, "dtype": "bfloat16",
                                           "medians": m}) + "\n" for s, m in [
        ("64x4096", {"tg=512": 50.0, "tg=128": 52.0, "tg=256": 60.0, "builtin": 49.0}),
        ("256x4096", {"tg=512": 50.0, "tg=128": 60.0, "tg=256": None, "builtin": 80.0})]))
    lines = predict.side_by_side_lines(rows, results, "H100", within, 1.05)
    assert "2 picks that are not the tuned best timed again beside it, 1 not timed (left out)" in lines[0]
    assert lines[1].startswith("predicted config  within 5%: 2/3")
    # like for like on the timed shapes: default 1.2x and failed, built-in 0.98x and 1.6x
    assert "predicted 1/2, kernel default 0/2, MLX built-in 1/2" in lines[2]
    assert lines[3] == "misses: softmax 256x4096 tg=128 (+20.0% vs tg=512)"
