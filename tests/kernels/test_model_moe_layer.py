"""``kernelfleet.patch`` runs mlx-lm's Qwen3-MoE decoder layer with quantized projections and experts as one
block (``model_moe_layer.quantized_moe_decoder_layer``): tiny random-weight ``qwen3_moe`` models
(``model_build.TINY``, quantized as ``mlx_lm.convert`` does: the router in 8 bits, group 64) on CPU, where
each kernel of the block runs the catalog's built-in inside the block's two compiled graphs. The stock
model's logits and greedy tokens are the reference, at the tolerance of :mod:`tests.kernels.test_model_quant`
(:data:`LOGIT_TOL` of the largest stock logit; on CPU the patched logits come out bit-identical, in float32
and in bfloat16). A 64-token prefill routes 256 (token, expert) pairs, so ``SwitchGLU``'s sort by expert
runs; a decode step's 4 pairs run unsorted (the gathered qmv's decode form)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models import qwen3_moe  # noqa: E402
from mlx_lm.models.cache import BatchKVCache  # noqa: E402

import kernelfleet  # noqa: E402
from kernelfleet.kernels.patch import model_moe_layer  # noqa: E402
from kernelfleet.kernels.patch.model_build import TINY, build, quantized_config  # noqa: E402
from kernelfleet.kernels.patch.model_moe_layer import KIND  # noqa: E402

from .test_model_layer import emulated_step, runner_ups, unpatched_is_stock  # noqa: E402
from .test_model_quant import LOGIT_TOL, PROMPT, batch_step, close, greedy, logits, profile_for  # noqa: E402

CONFIG = TINY["qwen3_moe"]  # hidden 128, 32 experts, 4 a token, expert width 64
WIDE = {**CONFIG, "moe_intermediate_size": 256}  # group 128: down_proj needs a multiple of 128 inputs
LONG = list(range(3, 67))  # 64 positions: 256 pairs, sorted by expert


def model_of(bits: int, group: int, dtype: str = "float32") -> tuple[dict[str, Any], Any]:
    config = WIDE if group == 128 else CONFIG
    return config, build(config, dtype, (bits, group))


def profile(config: dict[str, Any], bits: int, group: int, prefill: tuple[int, ...] = (len(LONG),),
            dtype: str = "float32") -> dict[str, Any]:
    quantization = quantized_config(config, dtype, (bits, group))["quantization"]
    return profile_for(config, bits, group, dtype=dtype, prefill=prefill, quantization=quantization)


def layers(report: Any) -> list[Any]:
    return [m for m in report.modules if m.kind == KIND]


@pytest.mark.parametrize("bits, group, dtype", [(4, 32, "float32"), (4, 64, "float32"), (4, 128, "float32"),
                                                (8, 32, "float32"), (8, 64, "float32"), (8, 128, "float32"),
                                                (4, 64, "bfloat16")])
def test_the_layer_is_one_block_and_keeps_the_logits(bits: int, group: int, dtype: str) -> None:
    config, model = model_of(bits, group, dtype)
    stock = logits(model, LONG)
    report = kernelfleet.patch(model, profile=profile(config, bits, group, dtype=dtype))
    # each layer one block: its attention, router, experts and norms are not patched on their own
    assert sorted({m.kind for m in report.modules}) == [KIND, "quantized linear", "rmsnorm"], str(report)
    blocks = layers(report)
    assert [m.path for m in blocks] == ["model.layers.0", "model.layers.1"] and all(m.patched for m in blocks)
    inter = config["moe_intermediate_size"]
    router = "" if (bits, group) == (8, 64) else " (router 8-bit group 64)"
    text = str(report)
    assert f"patched  {KIND} (128 -> 128 + 64 + 64 | 32 experts, top 4, 128 -> {inter} -> 128, {bits}-bit, " \
           f"group {group}{router}, {dtype}) x2: profile: quantized_matmul: custom at " in text
    for name in ("M=1 q/k/v (qmv)", "M=64 q/k/v (dq)", "M=1 o (qmv)", "M=1 router (qmv)", "M=64 router (dq)"):
        assert name in text
    assert "gather_quantized_matmul: custom at T=4 gate/up (qmv), T=256 gate/up (dq), T=4 down (qmv), " \
           "T=256 down (dq)" in text
    for a, b in zip(stock, logits(model, LONG), strict=True):
        assert close(a, b) <= LOGIT_TOL
    # the prefill: q/k/v, o, the router and the sorted experts' three projections with the profile's config;
    # the decode step: q/k/v, o, the router and the unsorted experts' three; each time the four norms
    # (untuned) the built-in
    assert all(m.calls == {"custom": 12, "builtin": 8, "module": 0} for m in blocks), \
        [m.calls for m in blocks]
    unpatched_is_stock(model, stock, LONG)
    assert all(type(layer) is qwen3_moe.Qwen3MoeDecoderLayer for layer in model.layers)


def test_greedy_decoding_keeps_stocks_tokens() -> None:
    """64 greedy steps: each a layer call at M=1 (4 pairs, unsorted), RoPE at a new offset through the same
    graph."""
    config, model = model_of(4, 64)
    tokens, margins = greedy(model, 64)
    scale = mx.abs(model(mx.array([PROMPT]))).max().item()
    report = kernelfleet.patch(model, profile=profile(config, 4, 64, prefill=(len(PROMPT),)))
    got, _ = greedy(model, 64)
    for step, (a, b, margin) in enumerate(zip(tokens, got, margins, strict=True)):
        if margin <= LOGIT_TOL * scale:
            break
        assert a == b, (step, a, b, margin)
    # q/k/v, o, the router and the experts (unsorted: at most 28 pairs): prompt + 64 steps
    assert all(m.calls["custom"] == 6 * 65 for m in layers(report))
    kernelfleet.unpatch(model)


def test_calls_without_a_cache_a_batch_and_a_prefill_without_entries() -> None:
    """A forward without a KV cache (RoPE from position 0, the sorted experts) takes the block; a decode
    batch of 3 sequences with no entry at M=3 runs the built-ins in the block; a profile with entries at
    decode only leaves the prefill of one sequence to the layer's own code."""
    config, model = model_of(4, 64)
    tokens = mx.array([LONG])
    stock, one = model(tokens), model(tokens[:, :1])
    cache, step, stock_batch = batch_step(model)
    report = kernelfleet.patch(model, profile=profile(config, 4, 64))
    blocks = layers(report)
    assert close(stock, model(tokens)) <= LOGIT_TOL  # no cache, 64 tokens
    assert all(m.calls == {"custom": 6, "builtin": 4, "module": 0} for m in blocks), [m.calls for m in blocks]
    assert close(one, model(tokens[:, :1])) <= LOGIT_TOL  # no cache, one token
    assert close(stock_batch, model(step, cache=cache)) <= LOGIT_TOL  # M=3: every kernel the built-in
    # one token: q/k/v, o, the router and the unsorted experts custom; M=3 (12 pairs, no entry): MLX's
    # gather_qmm for the experts, the built-in for the rest
    assert all(m.calls == {"custom": 12, "builtin": 8 + 7, "module": 0} for m in blocks)
    kernelfleet.unpatch(model)
    report = kernelfleet.patch(model, profile=profile(config, 4, 64, prefill=()))
    assert close(stock, model(tokens)) <= LOGIT_TOL
    assert all(m.calls == {"custom": 0, "builtin": 0, "module": 1} for m in layers(report))
    kernelfleet.unpatch(model)


def test_new_weights_an_offset_per_sequence_and_a_sharded_block_run_the_layers_own_code() -> None:
    """``load_weights`` replaces the q/k/v views the block joined; a batched cache holds an offset per
    sequence; ``model.shard`` gives the MoE block a group: each runs the layer's own code, as stock does."""
    config, model = model_of(4, 64)
    new = [(k, -v if k.endswith(".scales") else v) for k, v in tree_flatten(model.parameters())]
    other = build(config, "float32", (4, 64))
    other.load_weights(new)
    expected = logits(other, LONG)
    report = kernelfleet.patch(model, profile=profile(config, 4, 64))
    model.load_weights(new)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(expected, logits(model, LONG), strict=True))
    blocks = layers(report)
    assert all(m.calls == {"custom": 0, "builtin": 0, "module": 2} for m in blocks), [m.calls for m in blocks]
    kernelfleet.unpatch(model)

    config, model = model_of(4, 64)
    expected = logits(model, LONG)
    prompt = mx.array([LONG[:5], [0, 0, *LONG[:3]]])

    def batched() -> mx.array:
        cache = [BatchKVCache(left_padding=[0, 2]) for _ in model.layers]
        mx.eval(model(prompt, cache=cache))
        return model(mx.array([[7], [8]]), cache=cache)
    stock = batched()
    report = kernelfleet.patch(model, profile=profile(config, 4, 64))
    assert close(stock, batched()) <= LOGIT_TOL
    assert all(m.calls["module"] == 2 and m.calls["custom"] == 0 for m in layers(report))
    model.layers[0].mlp.sharding_group = mx.distributed.init()  # one process: a group of 1
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(expected, logits(model, LONG), strict=True))
    assert [m.calls["module"] for m in layers(report)] == [4, 2]
    kernelfleet.unpatch(model)


def test_layers_the_block_does_not_take_keep_their_own_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A router left in full precision, q/k/v in two formats or an mlx-lm whose code differs: the layer is
    kept, the report says why, and its modules take their own patterns (the logits stay stock's). A dense
    layer (``mlp_only_layers``) and an unquantized model are not the block's at all."""
    config, model = model_of(4, 64)
    layer0, layer1 = model.layers
    layer0.mlp.gate = nn.Linear(128, 32, bias=False)
    layer1.self_attn.v_proj = nn.QuantizedLinear(128, 64, bias=False, group_size=64, bits=8)
    mx.eval(model.parameters())
    stock = logits(model, LONG)
    report = kernelfleet.patch(model, profile=profile(config, 4, 64))
    why = {m.path: (m.patched, m.reason) for m in layers(report)}
    assert why == {
        "model.layers.0": (False, "kept mlx-lm's code: mlp.gate is a Linear, not a QuantizedLinear"),
        "model.layers.1": (False, "kept mlx-lm's code: q, k and v are not quantized in one format (the block "
                                  "runs them as one matmul)")}, str(report)
    experts = [m for m in report.modules if m.kind == "quantized experts"]
    assert len(experts) == 6 and all(m.patched for m in experts), str(report)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(stock, logits(model, LONG), strict=True))
    kernelfleet.unpatch(model)

    config, model = model_of(4, 64)
    monkeypatch.setattr(model_moe_layer, "SWITCH_GLU_LINES", ("x = mx.expand_dims(x, (-2, -3, -4))",))
    report = kernelfleet.patch(model, profile=profile(config, 4, 64))
    import mlx_lm

    assert {m.reason for m in layers(report)} == {
        f"kept mlx-lm's code: SwitchGLU.__call__ is not the computation this block replaces (mlx-lm "
        f"{mlx_lm.__version__})"}
    kernelfleet.unpatch(model)
    monkeypatch.undo()

    dense = {**CONFIG, "mlp_only_layers": [1]}
    model = build(dense, "float32", (4, 64))
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile=profile(dense, 4, 64, prefill=(len(PROMPT),)))
    assert [m.path for m in layers(report)] == ["model.layers.0"] and layers(report)[0].patched
    assert [m.path for m in report.modules if m.kind == "quantized gated MLP"] == ["model.layers.1.mlp"]
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(stock, logits(model, PROMPT), strict=True))
    kernelfleet.unpatch(model)

    report = kernelfleet.patch(build(CONFIG, "float32"), profile=profile(CONFIG, 4, 64))
    assert not layers(report)


def test_a_decode_step_with_custom_kernels_writes_the_epilogues(monkeypatch: pytest.MonkeyPatch) -> None:
    """With custom kernels (the Metal emulator as the GPU), a decode step's layer launches three quantized
    matmuls: q/k/v's normalises x and leaves q, k and v in attention's layout (then q_norm, k_norm, RoPE
    and the KV cache's two writes in MLX's ops, and the attention kernel: ``model_decode``), o's adds the
    residual, the
    router's is plain (8 bits); the experts' up, gate and down run the gathered qmv on the 4 pairs in the
    router's order (up and gate on the token's one row). The logits stay the stock model's."""
    config, model = model_of(4, 32)
    stock, patched, names = emulated_step(monkeypatch, model, profile(config, 4, 32, prefill=()))
    layer = ["kf_qmv_heads_norm", "kf_decode_attention", "kf_qmv_residual", "kf_qmv", *["kf_gather_qmv"] * 3]
    assert names == layer * 2 + ["kf_qmv"], names  # + LM head
    assert close(stock, patched) <= LOGIT_TOL


def test_a_fused_launch_takes_the_runner_up_where_the_built_in_won_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the built-in won alone at M=1 (the H200's Qwen3-30B-A3B q/k/v and o), a decode step's layer
    still runs as the block, its q/k/v and o launches taking the fastest custom config when it is within
    FUSED_MIN_SPEEDUP of the built-in: the work those launches absorb is host time the op-level tune does
    not see. Slower than that, the layer runs mlx-lm's own code. The report says which."""
    from kernelfleet.kernels.patch.profile_view import FUSED_MIN_SPEEDUP

    config, model = model_of(4, 32)
    base = profile(config, 4, 32, prefill=())
    # the experts' picks would run the block by themselves: left out, the quantized matmuls decide
    base = {**base, "entries": [e for e in base["entries"] if e["kernel"] != "gather_quantized_matmul"]}
    near = runner_ups(base, 0.95)
    stock, patched, names = emulated_step(monkeypatch, model, near)
    # the router and the LM head (1x128x256, as q/k/v joined here), not fused launches: the built-in
    assert names == ["kf_qmv_heads_norm", "kf_decode_attention", "kf_qmv_residual"] * 2, names
    assert close(stock, patched) <= LOGIT_TOL
    report = kernelfleet.patch(model, profile=near)
    kernelfleet.unpatch(model)
    layer = layers(report)[0]
    assert "M=1 q/k/v (qmv, fused; 0.95x alone)" in layer.reason and "M=1 o (qmv, fused; 0.95x alone)" \
        in layer.reason, layer.reason
    assert "M=1 router" in layer.reason.split("built-in at")[1]  # no fused launch: its plain pick
    far = runner_ups(base, FUSED_MIN_SPEEDUP - 0.05)
    _, patched, names = emulated_step(monkeypatch, model, far)
    assert names == [], names  # each layer ran mlx-lm's code
    report = kernelfleet.patch(model, profile=far)
    kernelfleet.unpatch(model)
    assert "fused" not in " ".join(m.reason for m in report.modules)
    # an entry's own custom pick that the noise kept out (1.01x alone: the H200's 8-bit q/k/v) serves too
    noisy = {**base, "entries": [{**e, "speedup": 1.01} if e["kernel"] == "quantized_matmul"
                                 and e["shape"].startswith("1x") else e for e in base["entries"]]}
    _, _, names = emulated_step(monkeypatch, model, noisy)
    assert names == ["kf_qmv_heads_norm", "kf_decode_attention", "kf_qmv_residual"] * 2, names
    report = kernelfleet.patch(model, profile=noisy)
    kernelfleet.unpatch(model)
    assert "M=1 q/k/v (qmv, fused; 1.01x alone)" in layers(report)[0].reason


def test_experts_patched_alone_run_the_decode_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the block (a layer it refuses, another model's SwitchGLU) each QuantizedSwitchLinear is
    patched alone: on the Metal emulator a decode step's unsorted experts launch the gathered qmv, up and
    gate on the token's one row, down on each pair's, and the logits stay the stock model's."""
    from kernelfleet.kernels.patch import model_patch

    moe_block = model_moe_layer.quantized_moe_decoder_layer
    blocks = tuple(b for b in model_patch.QUANTIZED_BLOCKS if b is not moe_block)
    monkeypatch.setattr(model_patch, "QUANTIZED_BLOCKS", blocks)
    config, model = model_of(4, 32)
    stock, patched, names = emulated_step(monkeypatch, model, profile(config, 4, 32, prefill=()))
    assert names.count("kf_gather_qmv") == 3 * 2, names  # up, gate and down in each of the 2 layers
    assert close(stock, patched) <= LOGIT_TOL
