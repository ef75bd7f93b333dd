"""A model's config.json -> the catalog kernel calls it makes, on the committed configs of public
architectures (tests/data/models: Llama-3-8B, Qwen3-30B-A3B, Mistral-7B-v0.1, Gemma-3-1B; GPT-2 as one
that is not mapped). Expected shapes are computed from each config's own fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.patch.model_shapes import ModelConfigError, derive, load_config
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


QUANT_ROWS = (1, 2, 3, 4, 8, 32, 512, 2048)  # decode 1, 8, 32; draft-verify 2, 3, 4; prefill 512, 2048


def test_quantized_matmul_at_every_quantized_layer_and_token_count() -> None:
    c = load_config(MODELS / "llama-3-8b.json")
    plan = derive({**c, "quantization": {"group_size": 64, "bits": 4, "mode": "affine"}})
    d, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * d // c["num_attention_heads"]
    # q, k and v joined (the patch runs them as one matmul: model_quant.quantized_attention), o, gate and
    # up joined (model_quant.quantized_gated_mlp), down, lm_head
    layers = [(d, d + 2 * kv), (d, d), (d, 2 * inter), (inter, d), (d, vocab)]
    assert plan.kernel_shapes["quantized_matmul"] == [fmt(m, k, n, 4, 64)
                                                      for k, n in layers for m in QUANT_ROWS]
    at = "model.layers.*."
    assert plan.sites["quantized_matmul"] == [
        f"4096 -> 6144, 4-bit group 64: {at}self_attn.q_proj+k_proj+v_proj x32",
        f"4096 -> 4096, 4-bit group 64: {at}self_attn.o_proj x32",
        f"4096 -> 28672, 4-bit group 64: {at}mlp.gate_proj+up_proj x32",
        f"14336 -> 4096, 4-bit group 64: {at}mlp.down_proj x32",
        "4096 -> 128256, 4-bit group 64: lm_head"]
    assert plan.notes == []
    for s in plan.kernel_shapes["quantized_matmul"]:
        get_spec("quantized_matmul").validate_shape(parse_shape(s))
    # the token counts are the plan's own: decode, draft-verify, prefill
    small = derive({**c, "quantization": {"group_size": 32, "bits": 8}}, decode=(1,), prefill=(128,),
                   verify=(5,))
    assert small.kernel_shapes["quantized_matmul"][:3] == ["1x4096x6144x8x32", "5x4096x6144x8x32",
                                                           "128x4096x6144x8x32"]
    assert small.kernel_shapes["rmsnorm"] == ["1x4096", "128x4096"]  # verify: the quantized matmuls only


def test_per_layer_quantization_overrides() -> None:
    """mlx-lm's config.json names a layer's own format by its path, or false for full precision; a
    format quantized_matmul does not take is left out and said."""
    c = load_config(MODELS / "llama-3-8b.json")
    q = {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 128, "bits": 8},
         "model.layers.1.mlp.down_proj": False, "lm_head": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
         "model.layers.2.self_attn.q_proj": {"group_size": 64, "bits": 3}}
    plan = derive({**c, "quantization": q}, decode=(1,), prefill=(), verify=())
    assert "1x14336x4096x8x128" in plan.kernel_shapes["quantized_matmul"]
    assert "1x4096x128256x4x64" not in plan.kernel_shapes["quantized_matmul"]
    assert "14336 -> 4096, 8-bit group 128: model.layers.0.mlp.down_proj" in plan.sites["quantized_matmul"]
    assert "14336 -> 4096, 4-bit group 64: model.layers.*.mlp.down_proj x30" in plan.sites["quantized_matmul"]
    assert "quantized_matmul left out for lm_head: mode 'mxfp4' (quantized_matmul takes 'affine'); " \
           "these layers keep MLX's op" in plan.notes
    assert "quantized_matmul left out for model.layers.2.self_attn.q_proj: 3-bit (quantized_matmul takes " \
           "4 or 8 bits); these layers keep MLX's op" in plan.notes
    assert "not quantized: model.layers.1.mlp.down_proj" in plan.notes
    # a layer whose q is left out runs k and v alone; the others join them
    assert "4096 -> 1024, 4-bit group 64: model.layers.2.self_attn.k_proj, model.layers.2.self_attn.v_proj" \
        in plan.sites["quantized_matmul"]
    assert "4096 -> 6144, 4-bit group 64: model.layers.*.self_attn.q_proj+k_proj+v_proj x31" \
        in plan.sites["quantized_matmul"]


def test_quantized_moe_plans_attention_router_and_experts() -> None:
    """Qwen3-30B-A3B as mlx-lm quantizes it: 4-bit, the router (mlp.gate) 8-bit; the experts'
    gather_qmm as gather_quantized_matmul at tokens x 8 pairs, sorted where mlx-lm sorts them (64 or
    more), in the router's order below (the kernel's qmv paths take them so)."""
    c = load_config(MODELS / "qwen3-30b-a3b.json")
    q: dict[str, Any] = {"group_size": 64, "bits": 4, "mode": "affine"}
    q.update({f"model.layers.{i}.mlp.gate": {"group_size": 64, "bits": 8} for i in range(48)})
    plan = derive({**c, "quantization": q}, decode=(1, 8), prefill=(2048,))
    # q, k and v joined: the MoE layer block runs them as one matmul (model_moe_layer)
    assert plan.sites["quantized_matmul"] == [
        "2048 -> 5120, 4-bit group 64: model.layers.*.self_attn.q_proj+k_proj+v_proj x48",
        "4096 -> 2048, 4-bit group 64: model.layers.*.self_attn.o_proj x48",
        "2048 -> 128, 8-bit group 64: model.layers.*.mlp.gate x48",
        "2048 -> 151936, 4-bit group 64: lm_head"]
    assert plan.kernel_shapes["quantized_matmul"][12:18] == [fmt(m, 2048, 128, 8, 64)
                                                             for m in (1, 2, 3, 4, 8, 2048)]
    assert plan.kernel_shapes["gather_quantized_matmul"] == [
        fmt(t, k, n, 128, 4, 64) for k, n in ((2048, 768), (768, 2048)) for t in (8, 16, 24, 32, 64, 16384)]
    assert plan.sites["gather_quantized_matmul"] == [
        "128 experts, 2048 -> 768, 4-bit group 64, 8 a token: model.layers.*.mlp.switch_mlp.gate_proj x48, "
        "model.layers.*.mlp.switch_mlp.up_proj x48",
        "128 experts, 768 -> 2048, 4-bit group 64, 8 a token: model.layers.*.mlp.switch_mlp.down_proj x48"]
    assert not any(n.startswith("gather_quantized_matmul left out") for n in plan.notes)
    for s in plan.kernel_shapes["gather_quantized_matmul"]:
        get_spec("gather_quantized_matmul").validate_shape(parse_shape(s))
    # a router left in full precision: the block refuses the layer, so its q, k and v run alone
    full = derive({**c, "num_hidden_layers": 2, "quantization": {**q, "model.layers.1.mlp.gate": False}},
                  decode=(1,), prefill=(), verify=())
    assert {"2048 -> 5120, 4-bit group 64: model.layers.0.self_attn.q_proj+k_proj+v_proj",
            "2048 -> 4096, 4-bit group 64: model.layers.1.self_attn.q_proj",
            "2048 -> 512, 4-bit group 64: model.layers.1.self_attn.k_proj, model.layers.1.self_attn.v_proj"} \
        <= set(full.sites["quantized_matmul"]), full.sites["quantized_matmul"]
    # a dense layer (mlp_only_layers) is no layer block: its q, k and v run alone
    dense = derive({**c, "num_hidden_layers": 2, "mlp_only_layers": [1], "quantization": q}, decode=(1,),
                   prefill=(), verify=())
    assert {"2048 -> 5120, 4-bit group 64: model.layers.0.self_attn.q_proj+k_proj+v_proj",
            "2048 -> 4096, 4-bit group 64: model.layers.1.self_attn.q_proj",
            "2048 -> 512, 4-bit group 64: model.layers.1.self_attn.k_proj, model.layers.1.self_attn.v_proj"} \
        <= set(dense.sites["quantized_matmul"])


def test_a_tied_head_and_layers_mlx_lm_leaves_in_full_precision() -> None:
    c = {**load_config(MODELS / "llama-3-8b.json"), "tie_word_embeddings": True, "intermediate_size": 14400,
         "quantization": {"group_size": 128, "bits": 4}}
    plan = derive(c, decode=(1,), prefill=(), verify=())
    assert all("x128256x" not in s for s in plan.kernel_shapes["quantized_matmul"])
    assert any("tied embedding" in n for n in plan.notes)
    # 14400 input features are not a multiple of 128: mlx-lm leaves down_proj in full precision
    assert "not quantized: model.layers.*.mlp.down_proj x32" in plan.notes
