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
