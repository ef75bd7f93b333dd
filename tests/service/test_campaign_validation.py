"""`kernelfleet admin campaign create` checks the campaign as the coordinator does before it prints the
plan, and with --dry-run too (issue 29, item 6): kernel, shape rank, dtype, backend and a size bound,
each error naming the option the user typed; nothing is sent. The coordinator refuses the same
campaigns (its request model uses the same checks). In-process: no coordinator is reachable at all."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from inproc import run_cli
from pydantic import ValidationError

from kernelfleet.service.schemas import CampaignIn


def nowhere() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


def create(*args: str) -> tuple[int, str, str]:
    r = run_cli("admin", "campaign", "create", "--name", "c", *args, "--coordinator", nowhere(),
                "--admin-token", "kfa_x")
    return r.exit_code, " ".join(r.stdout.split()), " ".join(r.stderr.split())


CASES = [
    (("--kernel", "rmsnrom", "--shape", "4096x4096", "--dtype", "float16", "--dry-run"),
     "--kernel 'rmsnrom': unknown kernel 'rmsnrom'; did you mean 'rmsnorm'?"),
    (("--kernel", "rope", "--shape", "4096x4096", "--dtype", "float16"),
     "--shape '4096x4096' (kernel rope): rope: expected a rank-3 shape"),
    (("--kernel-shape", "rope=4096", "--dtype", "float16", "--dry-run"),
     "--kernel-shape rope=4096: rope: expected a rank-3 shape"),
    (("--kernel", "rmsnorm", "--shape", "32x4096", "--dtype", "fp16"),
     "--dtype 'fp16': unknown dtype 'fp16'; choose float32, float16, bfloat16"),
    (("--kernel", "rmsnorm", "--shape", "32x4096", "--dtype", "float16", "--backend", "gpu", "--dry-run"),
     "--backend 'gpu': choose metal, cuda, cpu"),
    (("--kernel", "zmlx_rmsnorm", "--shape", "32x4096", "--dtype", "float16", "--backend", "cuda"),
     "--backend 'cuda': no backend can run every kernel"),
    (("--kernel", "rmsnorm", "--shape", "100000000x4096", "--dtype", "float16", "--dry-run"),
     "--shape '100000000x4096' (kernel rmsnorm): 409,600,000,000 elements, above the limit of "
     "1,073,741,824 (2**30) for one tensor (a float32 tensor of that size alone is 1.49 TiB)"),
]


@pytest.mark.parametrize(("args", "said"), CASES, ids=[c[1].split(":")[0] for c in CASES])
def test_bad_options_fail_before_the_plan_naming_the_option(args: tuple[str, ...], said: str) -> None:
    code, out, err = create(*args)
    assert code == 1, (out, err)
    assert said in err, err
    assert "plan:" not in out and "Traceback" not in err and "dtypes.0" not in err
    assert "cannot reach" not in err  # checked before anything is sent


def test_a_good_dry_run_prints_the_plan_and_sends_nothing() -> None:
    code, out, err = create("--kernel", "rmsnorm", "--shape", "32x4096", "--dtype", "float16", "--dry-run")
    assert code == 0 and "plan: 1 kernels" in out and "dry run: nothing queued" in out, (out, err)


def test_the_coordinator_refuses_the_same_campaigns() -> None:
    with pytest.raises(ValidationError, match="1.49 TiB"):
        CampaignIn.model_validate({"name": "c", "kernels": ["rmsnorm"], "shapes": ["100000000x4096"],
                                   "dtypes": ["float16"]})
    with pytest.raises(ValidationError, match="did you mean 'rmsnorm'"):
        CampaignIn.model_validate({"name": "c", "kernels": ["rmsnrom"], "shapes": ["32x4096"],
                                   "dtypes": ["float16"]})


LLAMA = str(Path(__file__).resolve().parents[1] / "data" / "models" / "llama-3-8b.json")
RUNTIME_CASES = [
    (("--kernel", "rmsnorm", "--shape", "8x64", "--dtype", "float16", "--runtime-settings", "--dry-run"),
     "--runtime-settings goes with --from-model"),
    (("--from-model", LLAMA, "--runtime-dtype", "4bit", "--dry-run"),
     "--runtime-dtype, --runtime-workload and --runtime-layers go with --runtime-settings"),
    (("--from-model", LLAMA, "--runtime-settings", "--runtime-dtype", "3bit", "--dry-run"),
     "--runtime-dtype '3bit': Input should be 'bf16', '4bit' or '8bit'"),
    (("--from-model", LLAMA, "--runtime-settings-only", "--runtime-workload", "train:1"),
     "--runtime-workload 'train:1': String should match pattern"),
    (("--from-model", LLAMA, "--runtime-settings-only", "--dtype", "float16"),
     "--runtime-settings-only queues no kernel jobs"),
]


@pytest.mark.parametrize(("args", "said"), RUNTIME_CASES,
                         ids=[c[1].split(":")[0][:40] for c in RUNTIME_CASES])
def test_bad_runtime_settings_options_fail_before_anything_is_sent(args: tuple[str, ...], said: str) -> None:
    code, out, err = create(*args)
    assert code == 1, (out, err)
    assert said in err, err
    assert "runtime settings:" not in out and "plan:" not in out and "Traceback" not in err
    assert "cannot reach" not in err


def test_runtime_settings_dry_runs_print_their_jobs(tmp_path: Path) -> None:
    code, out, err = create("--from-model", LLAMA, "--runtime-settings-only", "--runtime-layers", "8",
                            "--dry-run")
    assert code == 0, (out, err)
    said = ("runtime settings: llama h4096 x8 x bf16 at prefill:2048, decode:1, decode:8: one job per "
            "dtype and enrolled chip")
    assert said in out and "dry run: nothing queued" in out, out
    assert "plan:" not in out  # no kernel jobs
    # a 4-bit model's own weights by default, beside its kernel jobs
    config = json.loads(Path(LLAMA).read_text())
    config["quantization"] = {"group_size": 64, "bits": 4}
    quantized = tmp_path / "config.json"
    quantized.write_text(json.dumps(config))
    code, out, err = create("--from-model", str(quantized), "--runtime-settings", "--runtime-dtype", "4bit",
                            "--runtime-dtype", "bf16", "--runtime-workload", "decode:1", "--dry-run")
    assert code == 0, (out, err)
    assert "runtime settings: llama h4096 x32 x 4bit, bf16 at decode:1: one job per dtype" in out
    assert "plan:" in out
    code, out, err = create("--from-model", str(quantized), "--runtime-settings-only", "--dry-run")
    assert code == 0 and "x 4bit at" in out, (out, err)
