"""benchmarks/model.py end to end in its CPU mode (--tiny): tiny llama and qwen3_moe, built, patched,
measured side by side; and it imports nothing of the coordinator (it must run on a bare GPU host)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import BENCHMARKS

pytest.importorskip("mlx_lm")

RUN = """
import runpy, sys
sys.argv = ["model.py", "run", "--tiny", "--dtypes", "bf16,4bit", "--rounds", "1", "--prefill", "16",
            "--decode", "2", "--control"]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
server = sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "fastapi", "sqlalchemy", "httpx"))
print("SERVER MODULES", server)
"""


@pytest.mark.slow
def test_tiny_run_end_to_end() -> None:
    r = subprocess.run([sys.executable, "-c", RUN.format(path=str(BENCHMARKS / "model.py"))],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "SERVER MODULES []" in out
    for model in ("llama (2 layers, hidden 128, float32)", "llama (2 layers, hidden 128, 4-bit group 64)",
                  "qwen3_moe (2 layers, hidden 128, float32)",
                  "qwen3_moe (2 layers, hidden 128, 4-bit group 64)"):
        assert model in out
    assert out.count("prefill 16 ") == 4 and out.count("decode batch 2 ") == 4
    assert out.count("patched/stock") == 8 and out.count("replaced ops") == 8
    assert out.count("control, stock against stock: ") == 8
    assert "copy bandwidth (read + write): mlx_x_plus_0 " in out
    assert out.count("memory bound: ") == 4 and out.count("stock at ") == 4
    assert out.count("argmax agrees at 100.0%") == 4
    assert out.count("decode logits, teacher-forced 4 steps after 16 tokens: ") == 4
    assert out.count("argmax agrees at 4 of 4 steps") == 4
    assert out.count("greedy 8 steps: same tokens") == 4
    # the quantized models' linear layers run quantized_matmul (the Qwen3-MoE router in 8 bits, as
    # mlx_lm.convert quantizes it; the kernel's default at 16 tokens is MLX's op), the MoE experts
    # gather_quantized_matmul at 16 tokens x 4 experts
    assert "patched  quantized linear (128 -> 256, 4-bit, group 64, float32) x1: profile: " \
           "quantized_matmul: custom at M=2 (qmv); built-in at M=16" in out  # the LM head
    # Llama's decoder layers as one block each: q/k/v and gate/up joined, o and down, the activation and
    # the norms
    assert "patched  quantized decoder layer (128 -> 128 + 64 + 64 | 128 -> 256 -> 128, 4-bit, group 64, " \
           "float32) x2: profile: quantized_matmul: custom at M=2 q/k/v (qmv), M=2 o (qmv), " \
           "M=2 gate/up (qmv), M=2 down (qmv); built-in at M=16 q/k/v, M=16 o, M=16 gate/up, M=16 down; " \
           "swiglu: custom at M=2, M=16; rmsnorm: custom at M=2, M=16; add_rmsnorm: custom at M=2, " \
           "M=16" in out
    # Qwen3-MoE's decoder layers as one block each (model_moe_layer): q/k/v joined, o, the 8-bit router
    # and the experts (gather_quantized_matmul, sorted by expert at 16 tokens x 4 experts; at decode batch 2,
    # 8 pairs in the router's order, the decode form's qmv)
    assert "patched  quantized MoE decoder layer (128 -> 128 + 64 + 64 | 32 experts, top 4, " \
           "128 -> 64 -> 128, 4-bit, group 64 (router 8-bit group 64), float32) x2: profile: " \
           "quantized_matmul: custom at M=2 " \
           "q/k/v (qmv), M=2 o (qmv), M=2 router (qmv); built-in at M=16 q/k/v, M=16 o, M=16 router; " \
           "gather_quantized_matmul: custom at T=8 gate/up (qmv), T=64 gate/up (dq), T=8 down (qmv), " \
           "T=64 down (dq)" in out
    assert "moe router + combine" in out and "swiglu (experts)" in out
    assert out.count("modules patched, 0 kept") == 4  # tiny mode's profile: every planned call custom


AGAINST = """
import json, runpy, sys
from kernelfleet.kernels.patch import profile_file, runtime
body = {{"schema": profile_file.SCHEMA, "chip": runtime.target().chip, "entries": []}}
json.dump(body, open({empty!r}, "w"))
sys.argv = ["model.py", "run", "--tiny", "--dtypes", "4bit", "--rounds", "1", "--prefill", "16",
            "--decode", "2", "--against", {empty!r}]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
"""


@pytest.mark.slow
def test_against_times_a_second_profile_by_turns(tmp_path: Path) -> None:
    """--against: the model patched with a second profile (here one with no entries: every module kept, as
    stock) is a side of its own, its patch report printed, and each row gives patched against it, paired."""
    code = AGAINST.format(path=str(BENCHMARKS / "model.py"), empty=str(tmp_path / "empty.json"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       cwd=BENCHMARKS.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    # the tiny llama and qwen3_moe, each with a prefill and a decode row
    assert out.count("--against's profile:\n  kernelfleet.patch: 0 modules patched") == 2
    assert out.count("--against's profile ") == 4 and out.count("patched against it, paired: ") == 4
