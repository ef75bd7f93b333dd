"""``kernelfleet.patch`` on tiny quantized mlx-lm models (CPU): Llama and Qwen3-MoE from ``ModelArgs``
with random weights, ``nn.quantize``d at 4 and 8 bits, group sizes 32, 64 and 128.

The profile holds ``quantized_matmul`` entries at exactly the shapes
:func:`kernelfleet.kernels.patch.model_shapes.derive` plans from the config's ``quantization`` (the
campaign a user would run), so every quantized linear layer takes the kernel path at those token
counts; on CPU the kernel path runs the catalog's built-in (``mx.quantized_matmul``) inside the
patch's compiled graph. Stated tolerance: the patched logits stay within :data:`LOGIT_TOL` of the
largest stock logit (float32 here; the GPU figure is ``benchmarks/model.py``'s logits line), and
greedy decoding gives stock's tokens wherever stock's top-2 margin exceeds that.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

mlx_lm = pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

import kernelfleet  # noqa: E402
from kernelfleet.kernels.catalog import get_spec  # noqa: E402
from kernelfleet.kernels.patch import model_patch, runtime  # noqa: E402
from kernelfleet.kernels.patch.model_moe_layer import quantized_moe_decoder_layer  # noqa: E402
from kernelfleet.kernels.patch.model_shapes import ARCHITECTURES, derive  # noqa: E402
from kernelfleet.kernels.spec import parse_shape  # noqa: E402

LOGIT_TOL = 1e-4  # max |patched - stock| / max |stock logit|
PROMPT = [5, 17, 3, 99, 42, 8, 61]
# a Llama whose RoPE (dynamic NTK scaling) the decoder-layer block does not run, so that its attention and
# MLP blocks are the ones patched here (tests/kernels/test_model_layer.py: the layer as one block)
LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 128,
         "rope_theta": 500000.0, "tie_word_embeddings": False, "max_position_embeddings": 4096,
         "rope_scaling": {"type": "dynamic", "factor": 2.0}}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8,
             "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
             "moe_intermediate_size": 128, "rms_norm_eps": 1e-6, "vocab_size": 128, "rope_theta": 1e6,
             "tie_word_embeddings": False, "max_position_embeddings": 4096, "norm_topk_prob": True}
# QuantizedLinear layers: Llama 7 a layer + lm_head; the MoE 4 attention + the router (layer 0) or 3 MLP
# QuantizedLinear layers patched one by one (Llama's o_proj, the MoE's attention and router, LM head), the
# dense gated MLPs whose three projections run as one block (model_quant.quantized_gated_mlp, gate and up
# joined), and Llama's attention, whose q, k and v run joined (model_quant.quantized_attention; Qwen3's
# attention normalises q and k per head and keeps its layers)
QUANTIZED_LINEARS = {"llama": 2 * 1 + 1, "qwen3_moe": 4 + 1 + 4 + 1}
MLP_BLOCKS = {"llama": 2, "qwen3_moe": 1}
ATTENTION_BLOCKS = {"llama": 2, "qwen3_moe": 0}


@pytest.fixture(autouse=True)
def per_module_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Qwen3-MoE cases here check its layers' own patterns (the attention's and the router's quantized
    linear layers, the experts, the dense MLP block): what runs in a layer the MoE layer block refuses (a
    format, an mlx-lm whose code differs) and in other models' SwitchGLU experts (Mixtral). The block
    (model_moe_layer: tests/kernels/test_model_moe_layer.py) is left out of the patch for them."""
    others = tuple(b for b in model_patch.QUANTIZED_BLOCKS if b is not quantized_moe_decoder_layer)
    monkeypatch.setattr(model_patch, "QUANTIZED_BLOCKS", others)


def build(config: dict[str, Any], bits: int, group: int, dtype: Any = mx.float32, seed: int = 3) -> Any:
    module = importlib.import_module(f"mlx_lm.models.{ARCHITECTURES[config['model_type']].mlx_module}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(dtype)
    nn.quantize(model, group_size=group, bits=bits)
    mx.eval(model.parameters())
    return model


def profile_for(config: dict[str, Any], bits: int, group: int, dtype: str = "float32",
                decode: tuple[int, ...] = (1,), prefill: tuple[int, ...] = (len(PROMPT),),
                quantization: dict[str, Any] | None = None) -> dict[str, Any]:
    """``quantized_matmul`` and ``gather_quantized_matmul`` at every shape the planner derives from the
    config's quantization (``bits`` and ``group`` for every layer, or ``quantization`` as config.json holds
    it, with its per-layer overrides): the qmv path at one token and for unsorted experts (under 64 pairs),
    dequantize + matmul above (the kernels' configs; on CPU they run the built-ins)."""
    quantization = quantization or {"bits": bits, "group_size": group}
    plan = derive({**config, "quantization": quantization}, decode=decode, prefill=prefill, verify=(),
                  dtypes=[dtype])
    entries = []
    for kernel in ("quantized_matmul", "gather_quantized_matmul"):
        spec = get_spec(kernel)
        for s in plan.kernel_shapes.get(kernel, []):
            m = parse_shape(s)[0]  # tokens, or (token, expert) pairs: unsorted below 64
            qmv = m == 1 if kernel == "quantized_matmul" else m < 64
            path = "qmv" if qmv else "dq"
            config_ = next(c for c in spec.space(parse_shape(s), dtype) if c["path"] == path)
            entries.append({"kernel": kernel, "shape": s, "dtype": dtype, "config": config_})
    return {"schema": "kernelfleet-profile/1", "chip": "test", "entries": entries}


def logits(model: Any, tokens: list[int]) -> list[mx.array]:
    """A prefill and one decode step after it, with a KV cache."""
    cache = make_prompt_cache(model)
    out = [model(mx.array([tokens]), cache=cache)]
    out.append(model(mx.array([[11]]), cache=cache))
    mx.eval(out)
    return out


def close(stock: mx.array, patched: mx.array) -> float:
    return (mx.abs(stock - patched).max() / mx.abs(stock).max()).item()


def greedy(model: Any, steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens after PROMPT, and stock's top-2 logit margin at each step."""
    cache = make_prompt_cache(model)
    y = model(mx.array([PROMPT]), cache=cache)[:, -1, :]
    tokens, margins = [], []
    for _ in range(steps):
        top2 = mx.sort(y[0])[-2:]
        tokens.append(int(mx.argmax(y[0]).item()))
        margins.append(float((top2[1] - top2[0]).item()))
        y = model(mx.array([[tokens[-1]]]), cache=cache)[:, -1, :]
    return tokens, margins


def batch_step(model: Any) -> tuple[list[Any], mx.array, mx.array]:
    """(a KV cache after a prompt of 3 sequences, a decode step of them, stock's logits for that step),
    the cache set back to before the step so that the same step can run again."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([PROMPT, PROMPT[::-1], PROMPT]), cache=cache))
    step = mx.array([[11], [12], [13]])
    stock = model(step, cache=cache)
    for c in cache:
        c.offset -= 1
    return cache, step, stock


def quantized(report: Any) -> list[Any]:
    return [m for m in report.modules if m.kind == "quantized linear"]


def blocks(report: Any) -> list[Any]:
    return [m for m in report.modules if m.kind == "quantized gated MLP"]


def attentions(report: Any) -> list[Any]:
    return [m for m in report.modules if m.kind == "quantized attention projections"]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("config", [LLAMA, QWEN3_MOE], ids=["llama", "qwen3_moe"])
def test_quantized_layers_take_the_profile_and_keep_the_logits(config: dict[str, Any], bits: int,
                                                               group: int) -> None:
    model = build(config, bits, group)
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile=profile_for(config, bits, group))
    layers, mlps, attns = quantized(report), blocks(report), attentions(report)
    assert len(layers) == QUANTIZED_LINEARS[config["model_type"]], str(report)
    assert len(mlps) == MLP_BLOCKS[config["model_type"]], str(report)
    assert len(attns) == ATTENTION_BLOCKS[config["model_type"]], str(report)
    assert all(m.patched for m in layers + mlps + attns), str(report)
    text = str(report)
    if config["model_type"] == "llama":
        assert f"patched  quantized attention projections (128 -> 128 + 64 + 64, {bits}-bit, group " \
               f"{group}, float32) x2: profile: quantized_matmul: custom at M=1 q/k/v (qmv), " \
               f"M={len(PROMPT)} q/k/v (dq)" in text
    else:
        assert f"patched  quantized linear (128 -> 64, {bits}-bit, group {group}, float32)" in text
    assert f"quantized_matmul: custom at M=1 (qmv), M={len(PROMPT)} (dq)" in text  # what each runs
    assert f"patched  quantized gated MLP (128 -> 256 -> 128, {bits}-bit, group {group}, float32)" in text
    assert f"quantized_matmul: custom at M=1 gate/up (qmv), M={len(PROMPT)} gate/up (dq), M=1 down (qmv), " \
           f"M={len(PROMPT)} down (dq); swiglu: untuned" in text
    for a, b in zip(stock, logits(model, PROMPT), strict=True):
        assert close(a, b) <= LOGIT_TOL
    # the prefill and the decode step each took the kernel path at their own M, in every layer
    assert all(m.calls == {"custom": 2, "builtin": 0, "module": 0} for m in layers), \
        [(m.path, m.calls) for m in layers]
    # each block call: gate/up joined and down custom, the activation (untuned) the built-in
    assert all(m.calls == {"custom": 4, "builtin": 2, "module": 0} for m in mlps), [m.calls for m in mlps]
    assert all(m.calls == {"custom": 2, "builtin": 0, "module": 0} for m in attns), [m.calls for m in attns]
    if config["model_type"] == "qwen3_moe":  # 7 tokens x 2 experts: unsorted, the decode form's qmv
        experts = [m for m in report.modules if m.kind == "quantized experts"]
        assert len(experts) == 3 and all(m.patched for m in experts)
        assert experts[0].reason == "profile: gather_quantized_matmul: custom at T=2 (qmv), T=14 (qmv)", \
            experts[0].reason
        # the prefill and the decode step, each on the router's order
        assert all(m.calls == {"custom": 2, "builtin": 0, "module": 0} for m in experts), \
            [m.calls for m in experts]
    kernelfleet.unpatch(model)
    assert all(type(m) is nn.QuantizedLinear for _, m in model.named_modules()
               if isinstance(m, nn.QuantizedLinear))


@pytest.mark.parametrize("config, bits, group", [(LLAMA, 4, 64), (QWEN3_MOE, 8, 32)],
                         ids=["llama-q4", "moe-q8"])
def test_greedy_decoding_keeps_stocks_tokens(config: dict[str, Any], bits: int, group: int) -> None:
    """64 greedy steps (M=1 each) after a prompt: the patched tokens are stock's wherever stock's
    top-2 margin exceeds the tolerance (past the first step where it does not, they may part)."""
    model = build(config, bits, group)
    tokens, margins = greedy(model, 64)
    scale = mx.abs(model(mx.array([PROMPT]))).max().item()
    report = kernelfleet.patch(model, profile=profile_for(config, bits, group))
    got, _ = greedy(model, 64)
    for step, (a, b, margin) in enumerate(zip(tokens, got, margins, strict=True)):
        if margin <= LOGIT_TOL * scale:
            break
        assert a == b, (step, a, b, margin)
    assert all(m.calls["custom"] == 65 for m in quantized(report))  # the prompt, then 64 steps
    assert all(m.calls["custom"] == 2 * 65 for m in blocks(report))
    assert all(m.calls["custom"] == 65 for m in attentions(report))
    kernelfleet.unpatch(model)


def test_a_long_prefill_and_bfloat16() -> None:
    """A prefill of 512 positions (the issue's 2048 take seconds on this CPU: ``benchmarks/model.py``
    checks them on the GPU), and a bfloat16 model (the dtype quantized models run in)."""
    model = build(LLAMA, 4, 64)
    tokens = mx.random.randint(0, LLAMA["vocab_size"], (1, 512), key=mx.random.key(1))
    stock = model(tokens)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64, prefill=(512,)))
    patched = model(tokens)
    assert close(stock, patched) <= LOGIT_TOL
    assert mx.array_equal(mx.argmax(stock, -1), mx.argmax(patched, -1)).item()
    assert all(m.calls["custom"] == 1 for m in quantized(report))
    kernelfleet.unpatch(model)

    model = build(LLAMA, 8, 128, mx.bfloat16)
    stock = [a.astype(mx.float32) for a in logits(model, PROMPT)]
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 8, 128, "bfloat16"))
    assert "quantized gated MLP (128 -> 256 -> 128, 8-bit, group 128, bfloat16)" in str(report)
    for a, b in zip(stock, logits(model, PROMPT), strict=True):
        assert close(a, b.astype(mx.float32)) <= LOGIT_TOL
    assert all(m.calls["custom"] == 2 for m in quantized(report))
    kernelfleet.unpatch(model)


def test_each_call_picks_by_its_token_count() -> None:
    """A profile with entries at decode (M=1) only: the prefill runs each layer's own code, every
    decode step the kernel; a decode batch of 2 (M=2) has no entry and runs the layer's own code."""
    model = build(LLAMA, 4, 64)
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64, prefill=()))
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(stock, logits(model, PROMPT), strict=True))
    assert all(m.calls == {"custom": 1, "builtin": 0, "module": 1} for m in quantized(report))
    assert all(m.calls == {"custom": 2, "builtin": 1, "module": 1} for m in blocks(report))
    assert all(m.calls == {"custom": 1, "builtin": 0, "module": 1} for m in attentions(report))
    mx.eval(model(mx.array([[1], [2]])))
    assert all(m.calls["module"] == 2 for m in quantized(report))
    # a block at M=2 with no entry: one graph of the built-ins on x as (M, K), as a layer's own path there
    assert all(m.calls == {"custom": 2, "builtin": 4, "module": 1} for m in blocks(report))
    assert all(m.calls == {"custom": 1, "builtin": 1, "module": 1} for m in attentions(report))
    kernelfleet.unpatch(model)


@pytest.mark.parametrize("bits, group", [(4, 32), (8, 128)])
def test_a_decode_batch_without_an_entry_runs_mlx_on_m_by_k(monkeypatch: pytest.MonkeyPatch, bits: int,
                                                             group: int) -> None:
    """A decode step of 3 sequences (x of (3, 1, K)) where the profile has no entry at M=3: MLX's op,
    on x as (3, K), with the stock model's values bit for bit; a prompt of one sequence ((1, 7, K)) keeps
    the layer's own call."""
    model = build(LLAMA, bits, group, mx.bfloat16)
    cache, step, stock = batch_step(model)
    ranks: list[int] = []
    real = mx.quantized_matmul

    def seen(x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        ranks.append(x.ndim)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(mx, "quantized_matmul", seen)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, bits, group, "bfloat16", prefill=()))
    patched = model(step, cache=cache)
    assert mx.array_equal(stock, patched).item()
    assert ranks and set(ranks) == {2}  # traced once per shape, every layer's call on (M, K)
    assert all(m.calls == {"custom": 0, "builtin": 0, "module": 1} for m in quantized(report))
    assert all(m.calls == {"custom": 0, "builtin": 3, "module": 0} for m in blocks(report))
    assert all(m.calls == {"custom": 0, "builtin": 1, "module": 0} for m in attentions(report))
    mx.eval(model(mx.array([PROMPT])))  # (1, 7, K): the layer's own call
    assert set(ranks) == {2, 3}
    kernelfleet.unpatch(model)


def test_what_is_resolved_once_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runners are resolved on a layer's first call at a shape; later calls resolve nothing."""
    model = build(LLAMA, 4, 64)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64))
    calls: list[Any] = []
    real = runtime.resolve
    monkeypatch.setattr(runtime, "resolve", lambda *a: calls.append(a) or real(*a))
    logits(model, PROMPT)
    first = len(calls)
    # each layer: M=7, then M=1; each MLP block its 3 kernels (gate/up joined, activation, down) at both,
    # each attention block its joined q/k/v at both
    assert first == len(quantized(report)) * 2 + len(blocks(report)) * 3 * 2 + len(attentions(report)) * 2
    for _ in range(3):
        logits(model, PROMPT)
    assert len(calls) == first
    kernelfleet.unpatch(model)


class Holder(nn.Module):
    def __init__(self, *layers: nn.Module):
        super().__init__()
        self.layers = list(layers)
        self.norm = nn.RMSNorm(128)  # the patch reads the model's dtype from its norms

    def __call__(self, x: mx.array) -> list[mx.array]:
        return [layer(x) for layer in self.layers]


def test_formats_the_kernel_does_not_take_keep_mlx_and_say_why() -> None:
    class Mine(nn.QuantizedLinear):  # a subclass: its own code, never matched
        pass

    layers = [nn.QuantizedLinear(128, 64, bias=False, group_size=64, bits=3),
              nn.QuantizedLinear(128, 64, bias=False, group_size=32, bits=4, mode="mxfp4"),
              nn.QuantizedLinear(128, 64, bias=False, group_size=64, bits=6),
              Mine(128, 64, bias=False, group_size=64, bits=4),
              nn.QuantizedLinear(128, 64, bias=True, group_size=64, bits=4)]
    layers[-1].bias = mx.random.normal((64,))
    model = Holder(*layers)
    mx.eval(model.parameters())
    x = mx.random.normal((1, 3, 128))
    stock = model(x)
    entries = [{"kernel": "quantized_matmul", "shape": f"3x128x64x{b}x{g}", "dtype": "float32",
                "config": {"path": "dq"}} for b, g in ((3, 64), (4, 32), (6, 64), (4, 64))]
    report = kernelfleet.patch(model, profile={"schema": "kernelfleet-profile/1", "chip": "t",
                                               "entries": entries})
    why = {m.path: (m.patched, m.reason) for m in report.modules if m.kind == "quantized linear"}
    assert why == {
        "layers.0": (False, "kept MLX's op: 3-bit (quantized_matmul takes 4 or 8 bits)"),
        "layers.1": (False, "kept MLX's op: mode 'mxfp4' (quantized_matmul takes 'affine')"),
        "layers.2": (False, "kept MLX's op: 6-bit (quantized_matmul takes 4 or 8 bits)"),
        "layers.4": (True, "profile: quantized_matmul: custom at M=3 (dq)"),
    }, str(report)
    for a, b in zip(stock, model(x), strict=True):  # the bias is added after the kernel, as MLX does
        assert mx.array_equal(a, b).item()
    assert report.modules[-2].calls == {"custom": 1, "builtin": 0, "module": 0}
    kernelfleet.unpatch(model)


def test_the_gain_gate_of_quantized_layers_is_their_own() -> None:
    """A quantized_matmul pick must save its lean call path's gate (DEFAULT_MIN_GAIN_US: since the H100
    decode measurement, as high as the routed kernels' gate); patch(min_gain_us=...) sets one gate for
    all."""
    from kernelfleet.kernels.patch.profile_view import DEFAULT_MIN_GAIN_US

    model = build(LLAMA, 4, 64)
    profile = profile_for(LLAMA, 4, 64)
    for e in profile["entries"]:  # M=1 saves 2x the gate a call, M=7 half of it
        gain = 2 * DEFAULT_MIN_GAIN_US if e["shape"].startswith("1x") else DEFAULT_MIN_GAIN_US / 2
        e.update(median_us=50.0, speedup=1 + gain / 50.0)
    report = kernelfleet.patch(model, profile=profile)
    layer = quantized(report)[0]
    assert layer.patched and layer.reason == (f"profile: quantized_matmul: custom at M=1 (qmv); built-in at "
                                              f"M=7 (gains under {DEFAULT_MIN_GAIN_US:g} µs a call)")
    logits(model, PROMPT)
    assert layer.calls == {"custom": 1, "builtin": 0, "module": 1}
    kernelfleet.unpatch(model)
    report = kernelfleet.patch(model, profile=profile, min_gain_us=3 * DEFAULT_MIN_GAIN_US)
    assert not any(m.patched for m in quantized(report))
    kernelfleet.unpatch(model)


def test_where_custom_kernels_run_each_layer_launches_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (launches captured, no GPU needed): the prefill (M=7) launches the dequantize kernel of
    the dq path and a decode step (M=1) the qmv kernel, each on x reshaped to (M, K), once per layer."""
    from kernelfleet.kernels.render.launch import capture

    monkeypatch.setattr(runtime, "target", lambda: runtime.Target("test", "cuda"))
    model = build(LLAMA, 4, 64)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64))
    with capture() as launches:
        logits(model, PROMPT)
    layers, mlps, attns = quantized(report), blocks(report), attentions(report)
    # a block's activation is untuned: MLX's op, no launch; gate/up and q/k/v each one launch
    projections = len(layers) + 2 * len(mlps) + len(attns)
    assert len(launches) == 2 * projections
    qmv = [r for r in launches if r.rendered.name.startswith("kf_qmv_")]
    assert len(qmv) == projections
    assert {r.input_shapes[0] for r in qmv} == {(1, 128), (1, 256)}  # x as (M, K): K 128, or 256 (down_proj)
    assert all(dict(r.launch.template)["MR"] == 1 and dict(r.launch.template)["BITS"] == 4 for r in qmv)
    assert all(m.calls == {"custom": 2, "builtin": 0, "module": 0} for m in layers)
    assert all(m.calls == {"custom": 4, "builtin": 2, "module": 0} for m in mlps)
    assert all(m.calls == {"custom": 2, "builtin": 0, "module": 0} for m in attns)
    kernelfleet.unpatch(model)


def test_moe_experts_take_the_gathered_kernel_sorted_and_in_the_routers_order() -> None:
    """A 40-token prefill routes 80 (token, expert) pairs: SwitchGLU sorts them by expert and each expert
    projection runs gather_quantized_matmul at T=80; the decode step after it (2 pairs, unsorted) runs its
    decode form (up and gate on the token's row). The logits stay stock's."""
    tokens = list(range(3, 43))
    model = build(QWEN3_MOE, 4, 64)
    stock = logits(model, tokens)
    report = kernelfleet.patch(model, profile=profile_for(QWEN3_MOE, 4, 64, prefill=(len(tokens),)))
    experts = [m for m in report.modules if m.kind == "quantized experts"]
    assert len(experts) == 3 and all(m.patched for m in experts), str(report)
    assert "patched  quantized experts (8 experts, 128 -> 128, 4-bit, group 64, float32) x3: profile: " \
           "gather_quantized_matmul: custom at T=2 (qmv), T=80 (dq)" in str(report)
    for a, b in zip(stock, logits(model, tokens), strict=True):
        assert close(a, b) <= LOGIT_TOL
    assert all(m.calls == {"custom": 2, "builtin": 0, "module": 0} for m in experts), \
        [(m.path, m.calls) for m in experts]
    kernelfleet.unpatch(model)


def test_a_gated_mlp_is_one_block_only_where_its_projections_are_plain_quantized_layers() -> None:
    """An MLP whose down projection stays in full precision, or whose gate projection the kernel does not
    take (3 bits), is no block: each quantized projection keeps its own pattern (and its own reason);
    the logits stay stock's. Where all three are, the block runs gate and up at their bits and down at
    its own (8 bits here)."""
    model = build(LLAMA, 4, 64)
    layer0, layer1 = model.model.layers[0].mlp, model.model.layers[1].mlp
    layer0.down_proj = nn.Linear(256, 128, bias=False)  # full precision
    layer1.gate_proj = nn.QuantizedLinear(128, 256, bias=False, group_size=64, bits=3)
    mx.eval(model.parameters())
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64))
    assert not blocks(report), str(report)
    paths = {m.path for m in quantized(report)}
    assert {"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj",
            "model.layers.1.mlp.down_proj"} <= paths
    assert "kept MLX's op: 3-bit (quantized_matmul takes 4 or 8 bits)" in \
        {m.path: m.reason for m in quantized(report)}["model.layers.1.mlp.gate_proj"]
    for a, b in zip(stock, logits(model, PROMPT), strict=True):
        assert close(a, b) <= LOGIT_TOL
    kernelfleet.unpatch(model)

    model = build(LLAMA, 4, 64)
    for layer in model.model.layers:
        layer.mlp.down_proj = nn.QuantizedLinear(256, 128, bias=False, group_size=32, bits=8)
    mx.eval(model.parameters())
    stock = logits(model, PROMPT)
    profile = profile_for(LLAMA, 4, 64)
    profile["entries"] += [e for e in profile_for(LLAMA, 8, 32)["entries"] if "x256x128x" in e["shape"]]
    report = kernelfleet.patch(model, profile=profile)
    mlps = blocks(report)
    assert len(mlps) == 2 and all(m.patched for m in mlps), str(report)
    assert {m.label for m in mlps} == {"128 -> 256 -> 128, 4-bit, group 64 (down 8-bit, group 32)"}
    for a, b in zip(stock, logits(model, PROMPT), strict=True):
        assert close(a, b) <= LOGIT_TOL
    assert all(m.calls == {"custom": 4, "builtin": 2, "module": 0} for m in mlps)
    kernelfleet.unpatch(model)


def test_joined_projections_share_one_buffer_and_follow_new_weights() -> None:
    """Patching joins q/k/v and gate/up (model_quant.Joined): the layers' own arrays become views into
    the joined ones (the same values, the same parameter names: nothing is stored twice or added to
    the model's tree). New weights loaded after patching are what the model computes with: the block
    sees its views are gone and runs the module's own code. unpatch keeps the views' values."""
    from mlx.utils import tree_flatten

    model = build(LLAMA, 4, 64)
    before = dict(tree_flatten(model.parameters()))
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64))
    after = dict(tree_flatten(model.parameters()))
    assert after.keys() == before.keys()
    assert all(mx.array_equal(before[k], after[k]).item() for k in before)
    attn = model.model.layers[0].self_attn
    # the views' data lie back to back in one buffer: q's rows, then k's, then v's
    q, k, v = (np.asarray(attn[name]["weight"]) for name in ("q_proj", "k_proj", "v_proj"))  # no copy

    def address(a: np.ndarray) -> int:
        return int(a.__array_interface__["data"][0])
    assert address(k) == address(q) + q.nbytes and address(v) == address(k) + k.nbytes

    # other weights, loaded as mlx-lm's load_weights would: the patched model computes with them
    other = build(LLAMA, 4, 64, seed=11)
    expected = logits(other, PROMPT)
    model.load_weights(list(tree_flatten(other.parameters())))
    got = logits(model, PROMPT)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(expected, got, strict=True))
    assert all(m.calls["module"] == 2 for m in attentions(report) + blocks(report))
    kernelfleet.unpatch(model)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(expected, logits(model, PROMPT), strict=True))
    assert not all(close(a, b) <= LOGIT_TOL for a, b in zip(stock, expected, strict=True))


def test_a_decode_batch_runs_the_experts_decode_form_at_its_pairs() -> None:
    """Three sequences a step (6 pairs, unsorted): each expert projection takes the decode form at T=6, up
    and gate with each token's row for its 2 experts, and the step keeps stock's logits."""
    model = build(QWEN3_MOE, 4, 64)
    cache, step, stock = batch_step(model)
    report = kernelfleet.patch(model, profile=profile_for(QWEN3_MOE, 4, 64, decode=(1, 3)))
    assert close(stock, model(step, cache=cache)) <= LOGIT_TOL
    experts = [m for m in report.modules if m.kind == "quantized experts"]
    assert len(experts) == 3 and all(m.calls == {"custom": 1, "builtin": 0, "module": 0} for m in experts), \
        [m.calls for m in experts]
    assert "T=6 (qmv)" in experts[0].reason
    kernelfleet.unpatch(model)
