"""MLX's runtime settings (kernelfleet.worker.runtime_settings): the search end to end on a tiny
mlx-lm Llama with real MLX, one fresh process per side and round; a candidate that changes
arithmetic is rejected by the bit-identity check; `kernelfleet settings tune/show` (the CLI in this
process, each setting still measured in its own); apply sets the environment before MLX is imported
and prints the line after."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelfleet import runtime_settings_file as settings_file
from kernelfleet.worker.runtime_settings.apply import apply
from kernelfleet.worker.runtime_settings.knobs import BFS, TEST_ONLY_DTYPE, Knob, defaults, knobs, midpoints

pytest.importorskip("mlx_lm")

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
        "rope_theta": 500000.0, "tie_word_embeddings": False}


def kf_here(*args: str):  # in this process (a CLI process's start costs ~2 s on this host)
    from click.testing import CliRunner

    from kernelfleet.worker.cli import command

    return CliRunner().invoke(command(), list(args), prog_name="kernelfleet")


def test_search_rejects_a_setting_that_changes_arithmetic_and_the_budget_stops_it() -> None:
    from kernelfleet.worker.runtime_settings.search import Objective, search

    dtype = Knob("test only: the model in float16", (TEST_ONLY_DTYPE,), (("float16",),), refine=False)
    bfs = Knob(BFS.name, BFS.envs, ((5,),))
    lines: list[str] = []
    # 3 rounds asked, but the 1 s budget is spent by the end of the first (4 fresh processes: stock, the
    # two candidates, stock again; the first round always runs): one round, too few for any verdict
    choices, device = search(Objective(TINY, "float32", None, ("decode:1",), context=8, steps=2, reps=1),
                             (dtype, bfs), budget_s=1.0, rounds=3, log=lines.append)
    assert device["backend"] == "cpu" and device["mlx_version"]
    choice = choices["decode:1"]
    coarse = {json.dumps(e["settings"]): e for e in choice.evidence if e["stage"] == "coarse"}
    assert coarse[json.dumps({TEST_ONLY_DTYPE: "float16"})]["bit_identical"] is False
    assert coarse[json.dumps({"MLX_BFS_MAX_WIDTH": "5"})]["bit_identical"] is True  # eval order only
    assert len(coarse) == 2 and all(e["rounds"] == 1 for e in choice.evidence)
    assert [e["stage"] for e in choice.evidence] == ["coarse", "coarse", "coarse: control"]
    assert TEST_ONLY_DTYPE not in choice.setting
    assert choice.setting == {}
    assert choice.note == "budget spent after 1 coarse round(s) (a verdict needs 3)"
    assert any("LOGITS DIFFER: rejected" in line for line in lines)
    entry = choice.entry("llama h64 x2", "float32")
    assert entry["settings"] == choice.setting and entry["control"]["interval"]


def tune_tiny(model: Path, out: Path):  # type: ignore[no-untyped-def]
    """`kernelfleet settings tune` of the tiny Llama at decode:1 on a 1 s budget (one coarse round)."""
    model.write_text(json.dumps(TINY))
    r = kf_here("settings", "tune", "--model", str(model), "--compute-dtype", "float32", "--workload",
                "decode:1", "--context", "8", "--steps", "2", "--reps", "1", "--rounds", "3", "--budget", "1",
                "--out", str(out))
    assert r.exit_code == 0, r.stderr[-2000:]
    return r


def test_settings_tune_and_show_as_a_user_runs_them(tmp_path: Path) -> None:
    model, out = tmp_path / "tiny.json", tmp_path / "settings.json"
    r = tune_tiny(model, out)
    body = settings_file.read(out)
    assert body["backend"] == "cpu" and body["mlx_version"] and body["chip"]
    [entry] = body["entries"]
    assert (entry["model"], entry["dtype"], entry["workload"]) == ("llama h64 x2", "float32", "decode:1")
    # this backend's table: the BFS width's coarse grid, each in its own process
    coarse = [e["settings"]["MLX_BFS_MAX_WIDTH"] for e in entry["evidence"] if e["stage"] == "coarse"]
    assert sorted(coarse) == ["5", "80"]
    assert "llama h64 x2" in r.stdout and "decode:1" in r.stdout and f"wrote {out}" in r.stderr
    shown = kf_here("settings", "show", str(out))
    assert shown.exit_code == 0 and "llama h64 x2" in shown.stdout and "control" in shown.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["tune", "--model", "/nonexistent/config.json"], "--model /nonexistent/config.json"),
    (["tune", "--model", "tests/data/models/gpt2.json", "--workload", "decode:0"], "not prefill:TOKENS"),
    (["tune", "--model", "tests/data/models/gpt2.json", "--dtype", "3bit"], "is not bf16, 4bit or 8bit"),
    (["show"], "give a FILE or --chip NAME"),
    (["show", "README.md"], "not JSON"),
])
def test_bad_input_is_a_message_not_a_traceback(args: list[str], message: str) -> None:
    r = kf_here("settings", *args)
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert isinstance(r.exception, SystemExit)  # typer's exit, not an uncaught error


def _body(settings: dict[str, str], workload: str = "decode:8") -> dict:
    return {"schema": settings_file.SCHEMA, "chip": "NVIDIA H100 80GB HBM3", "entries": [
        {"model": "llama h64 x2", "dtype": "bf16", "workload": workload, "settings": settings, "gain": 1.2,
         "interval": [1.1, 1.3]}]}


APPLY = """
import os, sys, kernelfleet
done = kernelfleet.apply_settings({path!r}, model={model!r}, dtype="bf16", workload="decode:8")
print(json.dumps([done, os.environ.get("MLX_MAX_OPS_PER_BUFFER"), os.environ.get("MLX_BFS_MAX_WIDTH"),
                  "mlx.core" in sys.modules]))
"""


def test_apply_sets_the_environment_before_mlx_is_imported(tmp_path: Path) -> None:
    path, model = tmp_path / "s.json", tmp_path / "config.json"
    settings_file.write(_body({"MLX_MAX_OPS_PER_BUFFER": "50", "MLX_BFS_MAX_WIDTH": "5"}), path)
    model.write_text(json.dumps(TINY))
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MLX_")}
    r = subprocess.run([sys.executable, "-c", "import json" + APPLY.format(path=str(path), model=str(model))],
                       capture_output=True, text=True, timeout=60, env={**env, "MLX_BFS_MAX_WIDTH": "7"})
    assert r.returncode == 0, r.stderr
    done, ops, bfs, mlx_imported = json.loads(r.stdout.strip().splitlines()[-1])
    assert done == {"MLX_MAX_OPS_PER_BUFFER": "50"} and ops == "50"
    assert bfs == "7" and "kept MLX_BFS_MAX_WIDTH=7 from the environment (the file chose 5)" in r.stdout
    assert mlx_imported is False  # kernelfleet.apply_settings imports no mlx


def test_apply_after_mlx_is_imported_sets_nothing_and_prints_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core  # noqa: F401  (imported: what this test is about)

    monkeypatch.delenv("MLX_MAX_OPS_PER_BUFFER", raising=False)
    said: list[str] = []
    done = apply(_body({"MLX_MAX_OPS_PER_BUFFER": "50"}), model=TINY, workload="decode:8", echo=said.append)
    assert done == {} and "MLX_MAX_OPS_PER_BUFFER" not in __import__("os").environ
    assert "MLX is already imported" in said[0] and "export MLX_MAX_OPS_PER_BUFFER=50" in said[0]
    assert "decode:8 1.20x" in said[0]


def test_apply_refuses_entries_that_disagree() -> None:
    body = _body({"MLX_MAX_OPS_PER_BUFFER": "50"})
    body["entries"] += _body({"MLX_MAX_OPS_PER_BUFFER": "200"}, "decode:1")["entries"]
    with pytest.raises(settings_file.SettingsFileError, match="disagree on MLX_MAX_OPS_PER_BUFFER"):
        apply(body, model=TINY, echo=lambda _: None)


def test_knob_table_follows_mlx_source() -> None:
    assert [k.envs for k in knobs("cpu", "0.32.4")] == [("MLX_BFS_MAX_WIDTH",)]
    buffer = ("MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER")
    assert buffer in [k.envs for k in knobs("cuda", "0.30.0")]
    assert buffer not in [k.envs for k in knobs("cuda", "0.29.0")]  # 0.29 reads the ops limit only
    assert not any(TEST_ONLY_DTYPE in k.envs or "MLX_SDPA_BLOCKS" in k.envs for t in ("cuda", "metal", "cpu")
                   for k in knobs(t, "0.32.4"))
    h100 = defaults("cuda", "sm_90", "0.32.4")
    assert (h100["MLX_MAX_OPS_PER_BUFFER"], h100["MLX_MAX_MB_PER_BUFFER"]) == ("100", "1000")
    assert defaults("cuda", "sm_90", "0.30.1")["MLX_MAX_OPS_PER_BUFFER"] == "30"
    assert defaults("metal", "applegpu_g15s", "0.32.4")["MLX_MAX_MB_PER_BUFFER"] == "50"
    [cuda_buffer] = [k for k in knobs("cuda", "0.32.4") if "MLX_MAX_OPS_PER_BUFFER" in k.envs]
    # around 50/500, between the grid's 25/250 and MLX's default 100/1000
    assert midpoints(cuda_buffer, (50, 500), (100, 1000)) == [(35, 354), (71, 707)]


def test_a_side_matches_when_each_of_its_logits_is_one_of_stocks_own() -> None:
    """On MLX's CUDA backend a quantized decode step's logits take one of two values from run to run
    (H200, MLX 0.32.4): a side is bit-identical when each of its processes' logits is one stock's own
    processes (stock and the control) gave, and differs when any is not."""
    from kernelfleet.worker.runtime_settings.sides import CONTROL, STOCK, Rounds, compare

    w = "decode:1"
    rounds = Rounds(settings={STOCK: {}, CONTROL: {}, "same": {"A": "1"}, "other": {"A": "2"},
                              "mixed": {"A": "3"}})
    hashes = {STOCK: {"x"}, CONTROL: {"y"}, "same": {"x", "y"}, "other": {"z"}, "mixed": {"x", "z"}}
    for name, seen in hashes.items():
        rounds.seconds[name] = {w: [1.0, 1.0, 1.0]}
        rounds.logits[name] = {w: seen}
    assert compare(rounds, "same", w).bit_identical
    assert not compare(rounds, "other", w).bit_identical
    assert not compare(rounds, "mixed", w).bit_identical


def test_an_mlx_without_the_knobs_keeps_its_defaults_and_says_why() -> None:
    """A runtime-settings job on a worker whose MLX reads none of the knobs asked for (here: MLX's CPU
    backend and the command-buffer size, which only Metal and CUDA read) starts no process and
    answers MLX's defaults for every workload with the reason, for this machine's chip: the job is
    done, not failed (any worker of this chip and MLX would find the same)."""
    from kernelfleet.chips import detect_chip
    from kernelfleet.worker.runtime_settings.job import local_knobs, objective, run

    backend, version, table, why = local_knobs(["MLX_MAX_OPS_PER_BUFFER"])
    assert backend == "cpu" and table == ()
    assert why == (f"MLX {version} on cpu reads none of the runtime knobs MLX_MAX_OPS_PER_BUFFER "
                   "(docs/runtime_settings.md)")
    goal = objective({"config": TINY, "quantization": "4bit", "compute_dtype": "float32",
                      "workloads": ["prefill:64", "decode:1"]})
    lines: list[str] = []
    body = run(goal, table, budget_s=60, rounds=3, log=lines.append, why_none=why)
    chip = detect_chip()
    assert (body["chip"], body["backend"], body["mlx_version"]) == (chip.name, "cpu", chip.mlx_version)
    got = [(e["model"], e["dtype"], e["workload"], e["settings"], e["gain"], e["note"])
           for e in body["entries"]]
    assert got == [("llama h64 x2", "4bit float32", w, {}, 1.0, why) for w in ("prefill:64", "decode:1")]
    assert lines == [] and all(e["evidence"] == [] and e["round_gains"] == [] for e in body["entries"])


def test_the_first_process_does_not_set_the_round_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step process pays one-time costs the later ones do not (a 4-bit Llama's on an H200:
    82 s; the rest of its command, 35 more processes, 108 s): judged by it, a search's budget held one
    round where it had room for three. Rounds are judged by the slowest process after the first. (The
    processes here are stand-ins that only take time: what is checked is the scheduling.)"""
    import time

    from kernelfleet.worker.runtime_settings import sides

    took = iter([0.6] + [0.02] * 50)

    def step(request: dict[str, object], setting: dict[str, str], timeout: float) -> dict[str, object]:
        time.sleep(next(took))
        return {"device": "d", "backend": "cpu", "arch": "", "mlx_version": "0", "seconds": {"decode:1": 1.0},
                "logits": {"decode:1": "x"}}

    monkeypatch.setattr(sides, "run_step", step)
    # 3 sides (stock, one setting, stock again): by the first process's 0.6 s the next round would need
    # 1.8 s and the deadline (1.2 s) would stop it after one; the others take 0.02 s each
    rounds = sides.measure_rounds({}, [{"A": "1"}], 3, time.monotonic() + 1.2)
    assert rounds.count == 3
    assert rounds.first_s >= 0.6 and rounds.process_s < 0.3 and rounds.estimate == rounds.process_s
    # with an estimate handed on (a later stage's), no process is left out: a slow first one counts
    took = iter([0.6] + [0.02] * 50)
    later = sides.measure_rounds({}, [{"A": "1"}], 3, time.monotonic() + 1.2, first_free=False,
                                 process_s=0.01)
    assert later.count == 1 and later.first_s == 0.0 and later.process_s >= 0.6
