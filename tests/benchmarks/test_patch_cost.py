"""benchmarks/patch_cost.py end to end on CPU with a tiny Llama config: the op timed three ways, the
forward with each side against stock, and the decode step's host time, under cProfile too (on CPU
the custom path runs the catalog's built-ins; the GPU figures are in benchmarks/results)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import BENCHMARKS

pytest.importorskip("mlx_lm")

TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
              "rope_theta": 500000.0, "tie_word_embeddings": False}


@pytest.mark.slow
def test_patch_cost_runs_every_section(tmp_path: Path) -> None:
    from kernelfleet.kernels.patch import profile_file

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema": profile_file.SCHEMA, "chip": "test", "entries": [
        {"kernel": "add_rmsnorm", "shape": f"{rows}x128", "dtype": "bfloat16",
         "config": {"rpg": 1, "tg": 128, "vec": 1}, "median_us": 100.0, "speedup": 2.0}
        for rows in (16, 32)]}))
    out = tmp_path / "report.txt"
    r = subprocess.run([sys.executable, str(BENCHMARKS / "patch_cost.py"), "--profile", str(profile),
                        "--config", str(config), "--rows", "16", "--prefill", "16", "--decode", "2",
                        "--context", "16", "--steps", "4", "--rounds", "2", "--launches", "4",
                        "--cprofile", "5", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = out.read_text()
    assert report == r.stdout
    assert "add_rmsnorm (1, 16, 128) bfloat16" in report
    assert "x + r; mx.fast.rms_norm (mlx-lm's block)" in report
    assert "custom {'rpg': 1, 'tg': 128, 'vec': 1}" in report  # the profile's pick at 16 rows
    for row in ("prefill 16: stock", "decode batch 2: stock"):
        assert row in report
    assert report.count("    patched ") == 2 and report.count("    routed, built-ins ") == 2
    assert "decode batch 2: host time to build one step's graph, median of 2 rounds: stock" in report
    assert "decode batch 2, patched, 32 steps" in report and "function calls" in report


@pytest.mark.slow
def test_patch_cost_quantized_sections(tmp_path: Path) -> None:
    """--quantized: one QuantizedLinear four ways and the decode step stock, with raw kernel calls and
    patched, with the GPU's call structure
    emulated on CPU (the custom path a compiled graph of MLX's op) and no profile (every planned
    quantized_matmul shape at the kernel's default config)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    r = subprocess.run([sys.executable, str(BENCHMARKS / "patch_cost.py"), "--quantized", "8", "--group",
                        "32", "--emulate-gpu", "--config", str(config), "--decode", "1", "2", "--prefill",
                        "--context", "8", "--rounds", "2", "--launches", "4"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "quantized linear 128 -> 128, 8-bit group 32, bfloat16: host µs a call" in out
    for b in (1, 2):
        assert f"  batch {b} (" in out and f"decode batch {b}, 2 layers: host µs to build one step" in out
    assert out.count("    patched - raw kernel call") == 2  # one call alone
    # the decode step against the raw kernel calls, where the target is measured
    assert out.count("per quantized call: patched - raw kernel call") == 2
    for b in (1, 2):  # every quantized layer swapped for its runner on the raw side
        step = out.split(f"decode batch {b}, 2 layers")[1]
        assert "raw kernel calls" in step.split("(15 a step), patched")[0]
    assert "µs a patched quantized call (15 a step)" in out  # 7 a layer and the LM head
