"""benchmarks/decode_floor.py in its CPU mode (--tiny): both rows per dtype, each a step time."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from . import BENCHMARKS

pytest.importorskip("mlx_lm")


def test_tiny_floor_rows() -> None:
    cmd = [sys.executable, str(BENCHMARKS / "decode_floor.py"), "--tiny", "--dtypes", "4bit,bf16"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = re.findall(r"^llama 2 layers (model|host floor \(hidden 256\))\s+(4bit|bf16)\s+([\d.]+) ms a step",
                      r.stdout, re.M)
    assert sorted((kind, dt) for kind, dt, _ in rows) == sorted(
        (kind, dt) for kind in ("model", "host floor (hidden 256)") for dt in ("4bit", "bf16"))
    assert all(float(ms) > 0 for _, _, ms in rows)
