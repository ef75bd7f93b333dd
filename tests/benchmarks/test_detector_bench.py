"""benchmarks/detector.py's methodology on tiny corpora: each series draws its confirmation re-runs
(past its newest run) from a generator of its own, so that no series' re-runs depend on another's,
and several seeds pool into one report (sums first, then the ratios) with a row per seed."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from . import load


@pytest.fixture(scope="module")
def det() -> Any:
    """benchmarks/detector.py as a module."""
    return load("detector")


def _draws(det: Any, monkeypatch: pytest.MonkeyPatch, corpus: list[Any],
           order: list[int], method: Any) -> dict[int, list[float]]:
    """Each series' fresh re-run medians when the series are scored in ``order``."""
    drawn: dict[int, list[float]] = defaultdict(list)
    real = det.draw_run
    current = [-1]

    def record(rng: np.random.Generator, s: Any, t: int, **kw: float) -> Any:
        run = real(rng, s, t, **kw)
        drawn[current[0]].append(run.median_us)
        return run

    monkeypatch.setattr(det, "draw_run", record)  # after the corpus is built: only re-runs draw now
    for i in order:
        current[0] = i
        method(i, corpus[i])
    monkeypatch.setattr(det, "draw_run", real)
    return dict(drawn)


def test_each_series_draws_its_own_reruns(det: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = det.build_corpus(7, 60, 0.5)
    forward = list(range(len(corpus)))
    ours = det.ours(7, 0)
    ahead = _draws(det, monkeypatch, corpus, forward, ours)
    assert len(ahead) >= 2  # several series draw fresh re-runs: the property below has teeth
    # scored backwards, or with every other series left out, each series gets the same re-runs
    assert _draws(det, monkeypatch, corpus, forward[::-1], ours) == ahead
    for i in list(ahead)[:3]:
        assert _draws(det, monkeypatch, corpus, [i], ours) == {i: ahead[i]}
    # the two corpora of a seed, and two seeds, do not share a series' generator
    firsts = [det.rerun_rng(seed, table, 3).random() for seed, table in ((7, 0), (7, 1), (11, 0))]
    assert len(set(firsts)) == 3

    # the control: one generator shared by every series (as the benchmark had) moves them
    def shared(order: list[int]) -> dict[int, list[float]]:
        rng = np.random.default_rng(8)
        return _draws(det, monkeypatch, corpus, order, lambda i, s: det.ours_combined(s, rng))

    assert shared(forward[::-1]) != shared(forward)


ROW = re.compile(r"(ours \(step\+confirm\+scan\)|  seed \d+)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)")


def _rows(text: str, table: str) -> dict[str, list[float]]:
    """The rows of one corpus' table: label -> (precision, false/1000, alerts, TP, FP, comparisons)."""
    block = text.split(table, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines()[2:]:
        m = re.match(ROW, line)
        if m:
            rows[m.group(1).strip()] = [float(v) for v in m.groups()[1:]]
    return rows


def test_seeds_pool_sums_then_ratios(det: Any, tmp_path: Path) -> None:
    out = tmp_path / "detector.txt"
    assert det.main(["--no-peer", "--seeds", "7", "11", "--series", "40", "--series-68", "20",
                     "--out", str(out)]) == 0
    text = out.read_text()
    assert text.splitlines()[1].startswith("seeds 7, 11 (held out: 7, 11; thresholds tuned on seed 101")
    for table in ("at 5 % prevalence:", "at 68 % prevalence"):
        rows = _rows(text, table)
        assert set(rows) == {"ours (step+confirm+scan)", "seed 7", "seed 11"}
        pooled, a, b = rows["ours (step+confirm+scan)"], rows["seed 7"], rows["seed 11"]
        assert pooled[2:] == [x + y for x, y in zip(a[2:], b[2:], strict=True)]  # alerts, TP, FP, cmp
        assert pooled[0] == pytest.approx(pooled[3] / pooled[2], abs=5e-4)
        assert pooled[1] == pytest.approx(1000 * pooled[4] / pooled[5], abs=5e-3)
    assert "  seed 7:" in text and "  seed 11:" in text and "  pooled:" in text
    # --seed S is --seeds S
    one = tmp_path / "one.txt"
    det.main(["--no-peer", "--seed", "11", "--series", "40", "--series-68", "20", "--out", str(one)])
    single = _rows(one.read_text(), "at 5 % prevalence:")
    assert single["ours (step+confirm+scan)"] == _rows(text, "at 5 % prevalence:")["seed 11"]
