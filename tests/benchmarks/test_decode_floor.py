"""benchmarks/decode_floor.py in its CPU mode (--tiny): the step time of the model and of its floor
config per dtype, and each QuantizedLinear route's row (--routes)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from . import BENCHMARKS

pytest.importorskip("mlx_lm")

KINDS = ("model", r"host floor \(hidden 256\)")
ROUTES = ("stock", "MLX's op on (M, K), plain", "MLX's op on (M, K), mx.compile'd",
          "default config, compiled (runtime.resolve)", "kernelfleet.patch, gain gate 0")


def test_tiny_floor_and_routes() -> None:
    cmd = [sys.executable, str(BENCHMARKS / "decode_floor.py"), "--tiny", "--routes", "--dtypes", "4bit"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for kind in KINDS:
        for dt in ("4bit",):
            assert re.search(rf"^llama 2 layers {kind}\s+{dt}\s+[\d.]+ ms a step", r.stdout, re.M), (kind, dt)
        for route in ROUTES:
            row = re.search(rf"^llama 2 layers {kind}\s+4bit {re.escape(route)}\s+([\d.]+) ms a step "
                            r"\([+-][\d.]+ ms against stock, +[+-][\d.]+ us a QuantizedLinear call, "
                            r"15 a step", r.stdout, re.M)
            assert row and float(row.group(1)) > 0, (kind, route, r.stdout[-2000:])
    # CPU runs no mx.fast kernel: the plain kernel route is left out, not faked
    assert "spec.build" not in r.stdout


def test_tiny_graph_counts_a_decode_steps_primitives_and_calls() -> None:
    """--graph on the tiny Qwen3-MoE: each side's row names its primitives a step, the Python and C calls
    that build it, by kind; with each mx.fast op one node (as a GPU builds it), the patched step (the MoE
    decoder layer block's two compiled graphs) has fewer primitives and far fewer calls from Python."""
    cmd = [sys.executable, str(BENCHMARKS / "decode_floor.py"), "--tiny", "--graph", "--dtypes", "4bit",
           "--config", "tests/data/models/qwen3-30b-a3b.json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=BENCHMARKS.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {}
    for side in ("stock", "patched"):
        for fast in ("", r"one node a fast op\s+"):
            row = (rf"^qwen3_moe 2 layers 4bit\s+{side}\s+{fast}(\d+) primitives a step, built by "
                   r"(\d+) Python calls and (\d+) C calls in\s+[\d.]+ ms \(best\): (.+)$")
            m = re.search(row, r.stdout, re.M)
            assert m, (side, fast, r.stdout[-3000:])
            counts = dict(re.findall(r"(\w+) (\d+)", m.group(4)))
            assert sum(int(n) for n in counts.values()) == int(m.group(1))  # the kinds add up to the step
            rows[side, bool(fast)] = (int(m.group(1)), int(m.group(2)), int(m.group(3)), counts)
    stock, patched = rows["stock", True], rows["patched", True]
    assert patched[0] < stock[0] and 2 * patched[1] < stock[1], (stock[:3], patched[:3])
    assert "QuantizedMatmul" in stock[3] and "Depends" in stock[3]  # the fast ops' stand-ins, one node each
