"""A model's config.json -> the catalog kernel calls it makes, on the committed configs of public
architectures (tests/data/models: Llama-3-8B, Qwen3-30B-A3B, Mistral-7B-v0.1, Gemma-3-1B; GPT-2 as one
that is not mapped). Expected shapes are computed from each config's own fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.model_shapes import ModelConfigError, derive, load_config
from kernelfleet.kernels.spec import parse_shape

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
DECODE, PREFILL = (1, 8, 32), (512, 2048)
ROWS = (*DECODE, *PREFILL)


def fmt(*dims: int) -> str:
    return "x".join(map(str, dims))


def rope_shapes(heads: int, kv: int, head_dim: int) -> list[str]:
    return [fmt(b * h, 1, head_dim) for b in DECODE for h in (heads, kv)] + \
        [fmt(h, n, head_dim) for n in PREFILL for h in (heads, kv)]


def unique(xs: list[str]) -> list[str]:
    return list(dict.fromkeys(xs))


@pytest.mark.parametrize("name", ["llama-3-8b", "mistral-7b-v0.1"])
def test_dense_llama_family(name: str) -> None:
    c = load_config(MODELS / f"{name}.json")
    plan = derive(c)
    d, inter = c["hidden_size"], c["intermediate_size"]
    h, kv = c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = d // h
    assert (d, inter, h, kv, head_dim) == (4096, 14336, 32, 8, 128)  # the published values
    assert plan.dims == {"hidden_size": d, "intermediate_size": inter, "num_attention_heads": h,
                         "num_key_value_heads": kv, "head_dim": head_dim}
    assert plan.kernel_shapes == {
        "rmsnorm": [fmt(t, d) for t in ROWS],
        "add_rmsnorm": [fmt(t, d) for t in ROWS],
        "rope": unique(rope_shapes(h, kv, head_dim)),
        "swiglu": [fmt(t, inter) for t in ROWS],
    }
    assert plan.dtypes == ["bfloat16"] and plan.notes == []
    assert plan.job_count == 5 + 5 + 9 + 5  # rope 32x1 / 8x1 / 256x1 (b=8 q, b=32 kv) / ... once each
    for kernel, shapes in plan.kernel_shapes.items():  # every planned job is one the catalog accepts
        for s in shapes:
            get_spec(kernel).validate_shape(parse_shape(s))


def test_qwen3_moe() -> None:
    c = load_config(MODELS / "qwen3-30b-a3b.json")
    plan = derive(c, dtypes=["bfloat16", "float16"])
    d, h, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    e, k, moe_inter = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    assert (d, h, kv, hd, e, k, moe_inter) == (2048, 32, 4, 128, 128, 8, 768)
    assert plan.dims["experts"] == e and plan.dims["experts_per_token"] == k
    assert plan.kernel_shapes["rmsnorm"] == unique(
        [fmt(t, d) for t in ROWS] + [fmt(t * n, hd) for t in ROWS for n in (h, kv)])  # + q_norm, k_norm
    assert plan.kernel_shapes["rope"] == unique(rope_shapes(h, kv, hd))
    assert plan.kernel_shapes["swiglu"] == [fmt(t * k, moe_inter) for t in ROWS]  # experts only: no dense MLP
    assert plan.kernel_shapes["topk_gating_softmax"] == [fmt(t, e) for t in ROWS]
    assert plan.kernel_shapes["moe_combine"] == [fmt(t, k, d) for t in ROWS]
    assert plan.job_count == sum(len(v) for v in plan.kernel_shapes.values()) * 2
    assert any("k=8" in n for n in plan.notes)  # topk is tuned at its default k: said, not hidden


def test_gemma3_geglu_and_rope() -> None:
    c = load_config(MODELS / "gemma-3-1b.json")
    plan = derive(c)
    h, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd, inter = c["head_dim"], c["intermediate_size"]
    assert (h, kv, hd, inter) == (4, 1, 256, 6912)
    assert plan.kernel_shapes == {"rope": unique(rope_shapes(h, kv, hd)),
                                  "geglu": [fmt(t, inter) for t in ROWS]}
    assert any("RMSNorm (weight + 1" in n for n in plan.notes)


def test_token_counts_are_configurable() -> None:
    plan = derive(load_config(MODELS / "llama-3-8b.json"), decode=(4,), prefill=(128,))
    assert plan.kernel_shapes["rmsnorm"] == ["4x4096", "128x4096"]
    assert plan.kernel_shapes["rope"] == ["128x1x128", "32x1x128", "32x128x128", "8x128x128"]


def test_int4_dequantize_from_the_quantization_group_size() -> None:
    c = load_config(MODELS / "llama-3-8b.json")
    plan = derive({**c, "quantization": {"group_size": 64, "bits": 4}})
    assert plan.dims["quantization_group_size"] == 64
    assert plan.kernel_shapes["int4_dequantize"] == ["4096x4096", "1024x4096", "14336x4096", "4096x14336"]
    other = derive({**c, "quantization": {"group_size": 32, "bits": 4}})
    assert "int4_dequantize" not in other.kernel_shapes
    assert any("group_size=32" in n for n in other.notes)


def test_rope_scaling_the_catalog_cannot_express_is_left_out_and_said() -> None:
    c = load_config(MODELS / "llama-3-8b.json")
    plan = derive({**c, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    assert "rope" not in plan.kernel_shapes
    assert any("rope_scaling 'llama3'" in n for n in plan.notes)


def test_unknown_architecture_names_the_fields_it_could_not_map() -> None:
    with pytest.raises(ModelConfigError) as e:
        derive(load_config(MODELS / "gpt2.json"))
    msg = str(e.value)
    assert "architecture 'gpt2' is not mapped" in msg
    assert "fields that could not be mapped: n_embd, n_head, n_layer" in msg
    assert "fields not in this config: hidden_size, intermediate_size, num_attention_heads" in msg


@pytest.mark.parametrize("change, field", [
    ({"intermediate_size": None}, "intermediate_size"),
    ({"hidden_size": "4096"}, "hidden_size (='4096', not a positive integer)"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok (=0, not a positive integer)"),
])
def test_a_mapped_architecture_with_a_bad_field(change: dict[str, Any], field: str) -> None:
    c = {k: v for k, v in {**load_config(MODELS / "qwen3-30b-a3b.json"), **change}.items() if v is not None}
    with pytest.raises(ModelConfigError) as e:
        derive(c)
    assert f"qwen3_moe: could not map these fields: {field}" in str(e.value)


def test_unreadable_configs(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    for name, message in (("missing.json", "no such file"), ("bad.json", "not JSON"),
                          ("list.json", "expected a JSON object")):
        with pytest.raises(ModelConfigError, match=message):
            load_config(tmp_path / name)
