"""`kernelfleet kernels` and `kernelfleet tune` as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernelfleet.worker.report import report_problems


def kf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_kernels_lists_the_catalog():
    from kernelfleet.kernels.catalog import all_specs

    r = kf("kernels")
    assert r.returncode == 0, r.stderr
    for spec in all_specs():
        assert spec.name in r.stdout
    assert "dtypes" in r.stdout and "float16" in r.stdout
    assert "zmlx_rmsnorm" in r.stdout and "Metal only" in r.stdout  # zmlx's own kernels too


def test_tune_table():
    r = kf("tune", "rmsnorm", "--shape", "16x512", "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    for word in ("config", "median", "p10–p90", "max abs err", "speedup", "builtin", "(best)", "1.00×", "ok"):
        assert word in r.stdout
    assert "Traceback" not in r.stderr


def test_tune_json_and_out_append(tmp_path):
    out = tmp_path / "results.jsonl"
    first = kf("tune", "rmsnorm", "--shape", "4x256", "--dtype", "float32", "--seed", "7", "--json",
               "--out", str(out))
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report_problems(report) == [] and report["seed"] == 7 and report["dtype"] == "float32"
    second = kf("tune", "rmsnorm", "--shape", "4x256", "--strategy", "exhaustive", "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert f"appended the report to {out}" in second.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == report  # the --out line is exactly the report
    assert json.loads(lines[1])["strategy"] == "exhaustive" and report_problems(json.loads(lines[1])) == []


@pytest.mark.parametrize(("args", "message"), [
    (("tune", "nosuch", "--shape", "8x256"), "unknown kernel 'nosuch'; known kernels:"),
    (("tune", "rmsnorm", "--shape", "8xabc"), "malformed shape '8xabc'"),
    (("tune", "rmsnorm", "--shape", "0x256"), "every dimension must be a positive integer"),
    (("tune", "rmsnorm", "--shape", "8x256", "--dtype", "int8"), "does not support dtype 'int8'"),
    (("tune", "rmsnorm", "--shape", "8x256", "--strategy", "genetic"), "unknown search strategy 'genetic'"),
    (("tune", "rmsnorm", "--shape", "8x256", "--budget", "0"), "budget must be a positive number"),
    (("tune", "rmsnorm", "--shape", "8x256", "--backend", "opencl"), "unknown backend 'opencl'"),
])
def test_bad_input_exits_2_with_a_message(args, message):
    r = kf(*args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_unwritable_out_is_refused_before_tuning(tmp_path):
    r = kf("tune", "rmsnorm", "--shape", "4x256", "--out", str(tmp_path / "missing" / "x.jsonl"))
    assert r.returncode == 2 and "cannot append to" in r.stderr and "Traceback" not in r.stderr
