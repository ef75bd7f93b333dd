"""``kernelfleet admin campaign create --from-model`` on a quantized model's config.json: the plan it
prints and hands to the coordinator (``service.campaign_plan``, called in-process: no coordinator)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import typer
from rich.console import Console

from kernelfleet.service import campaign_plan

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"


def plan(config: Path, **options: object) -> tuple[dict[str, list[str]], list[str], str, str]:
    out, err = io.StringIO(), io.StringIO()
    kwargs: dict = {"kernel": [], "shape": [], "kernel_shape": [], "from_model": config, "decode": None,
                    "prefill": None, "dtype": [], "name": None, **options}
    sets, dtypes, name = campaign_plan.shape_sets(**kwargs, out=Console(file=out, width=400),
                                                  err=Console(file=err, width=400))
    return sets, dtypes, name, out.getvalue()


def test_a_quantized_model_plans_its_quantized_matmuls(tmp_path: Path) -> None:
    config = json.loads((MODELS / "llama-3-8b.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4, "mode": "affine",
                              "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8}}
    path = tmp_path / "Llama-3-8B-4bit" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    sets, dtypes, name, printed = plan(path, decode=[1, 8], prefill=[2048])
    assert name == "llama (Llama-3-8B-4bit)" and dtypes == ["bfloat16"]
    shapes = sets["quantized_matmul"]
    assert shapes[:6] == [f"{m}x4096x6144x4x64" for m in (1, 2, 3, 4, 8, 2048)]  # q/k/v joined
    assert "1x14336x4096x8x64" in shapes and "1x4096x28672x4x64" in shapes  # down in 8 bits, gate/up joined
    assert len(shapes) == 6 * 6  # 6 layer formats x 6 token counts
    assert "quantized matmuls also at 2, 3, 4 (draft-verify)" in printed
    assert "quantized_matmul" in printed and "model.layers.0.mlp.down_proj" in printed  # where it is called
    sets, _, _, printed = plan(path, decode=[1], prefill=[512], verify=[4])
    assert sets["quantized_matmul"][:3] == ["1x4096x6144x4x64", "4x4096x6144x4x64", "512x4096x6144x4x64"]
    assert "quantized matmuls also at 4 (draft-verify)" in printed


def test_verify_goes_with_from_model() -> None:
    err = io.StringIO()
    with pytest.raises(typer.Exit):
        campaign_plan.shape_sets(kernel=["rmsnorm"], shape=["8x64"], kernel_shape=[], from_model=None,
                                 decode=None, prefill=None, verify=[3], dtype=["float16"], name="x",
                                 out=Console(file=io.StringIO()), err=Console(file=err, width=400))
    assert "--decode, --prefill and --verify go with --from-model" in err.getvalue()
