"""``kernelfleet.patch`` runs mlx-lm's llama decoder layer with quantized projections as one block
(``model_layer.quantized_decoder_layer``): tiny random-weight Llamas on CPU, where each kernel of the
block runs the catalog's built-in inside the block's two compiled graphs. The stock model's logits and
greedy tokens are the reference, at the tolerance of :mod:`tests.kernels.test_model_quant`."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

import kernelfleet  # noqa: E402
from kernelfleet.kernels.catalog import get_spec  # noqa: E402
from kernelfleet.kernels.patch import model_decode  # noqa: E402

from .test_model_quant import (  # noqa: E402
    LOGIT_TOL,
    PROMPT,
    batch_step,
    build,
    close,
    greedy,
    logits,
    profile_for,
)

# nn.RoPE (rope_scaling absent) and mlx-lm's Llama3RoPE (Llama 3.1 and later)
LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 128,
         "rope_theta": 500000.0, "tie_word_embeddings": False}
LLAMA3 = {**LLAMA, "max_position_embeddings": 4096,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
KINDS = {"quantized decoder layer", "quantized attention projections", "quantized gated MLP",
         "quantized linear"}


def by_kind(report: Any) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for m in report.modules:
        if m.kind in KINDS:
            found.setdefault(m.kind, []).append(m)
    return found


@pytest.mark.parametrize("bits, group", [(4, 32), (4, 64), (8, 128)])
@pytest.mark.parametrize("config", [LLAMA, LLAMA3], ids=["rope", "llama3-rope"])
def test_the_layer_is_one_block_and_keeps_the_logits(config: dict[str, Any], bits: int, group: int) -> None:
    model = build(config, bits, group)
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile=profile_for(config, bits, group))
    kinds = by_kind(report)
    # each layer one block; its attention, MLP and projections are not patched on their own
    assert sorted(kinds) == ["quantized decoder layer", "quantized linear"], str(report)
    layers, (head,) = kinds["quantized decoder layer"], kinds["quantized linear"]
    assert [m.path for m in layers] == ["model.layers.0", "model.layers.1"] and head.path == "lm_head"
    assert all(m.patched for m in layers)
    m = len(PROMPT)
    assert f"patched  quantized decoder layer (128 -> 128 + 64 + 64 | 128 -> 256 -> 128, {bits}-bit, " \
           f"group {group}, float32) x2: profile: quantized_matmul: custom at M=1 q/k/v (qmv), M={m} q/k/v " \
           f"(dq), M=1 o (qmv), M={m} o (dq), M=1 gate/up (qmv)" in str(report)
    for a, b in zip(stock, logits(model, PROMPT), strict=True):
        assert close(a, b) <= LOGIT_TOL
    # the prefill and the decode step: four quantized matmuls with the profile's config each, the
    # norms and the activation (untuned) the built-in
    assert all(m.calls == {"custom": 8, "builtin": 6, "module": 0} for m in layers), [m.calls for m in layers]
    unpatched_is_stock(model, stock, PROMPT)


def unpatched_is_stock(model: Any, stock: list[mx.array], tokens: list[int]) -> None:
    """``kernelfleet.unpatch`` gives every layer its own class back, and the model stock's logits."""
    kernelfleet.unpatch(model)
    linears = [q for _, q in model.named_modules() if isinstance(q, nn.QuantizedLinear)]
    assert linears and all(type(q) is nn.QuantizedLinear for q in linears)
    assert all("__call__" not in vars(type(layer)) or type(layer).__module__.startswith("mlx_lm.")
               for layer in model.layers)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(stock, logits(model, tokens), strict=True))


def test_greedy_decoding_keeps_stocks_tokens() -> None:
    """64 greedy steps: each a layer call at M=1, RoPE at a new offset through the same graph."""
    model = build(LLAMA3, 4, 64)
    tokens, margins = greedy(model, 64)
    scale = mx.abs(model(mx.array([PROMPT]))).max().item()
    report = kernelfleet.patch(model, profile=profile_for(LLAMA3, 4, 64))
    got, _ = greedy(model, 64)
    for step, (a, b, margin) in enumerate(zip(tokens, got, margins, strict=True)):
        if margin <= LOGIT_TOL * scale:
            break
        assert a == b, (step, a, b, margin)
    assert all(m.calls["custom"] == 4 * 65 for m in by_kind(report)["quantized decoder layer"])
    kernelfleet.unpatch(model)


def test_calls_without_a_cache_a_batch_and_a_prefill_without_entries() -> None:
    """A forward without a KV cache (RoPE from position 0) takes the block; a decode batch of 3
    sequences with no entry at M=3 runs the built-ins on x as (M, K) in the block; a profile with
    entries at decode only leaves the prefill of one sequence to the layer's own code."""
    model = build(LLAMA, 4, 64)
    tokens = mx.array([PROMPT])
    stock = model(tokens)
    cache, step, stock_batch = batch_step(model)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64, prefill=()))
    layers = by_kind(report)["quantized decoder layer"]
    assert close(stock_batch, model(step, cache=cache)) <= LOGIT_TOL
    assert all(m.calls == {"custom": 0, "builtin": 7, "module": 0} for m in layers)
    assert close(stock, model(tokens)) <= LOGIT_TOL  # no cache, 7 tokens, one sequence: no entry
    assert all(m.calls["module"] == 1 for m in layers)
    cache = make_prompt_cache(model)
    mx.eval(model(tokens, cache=cache))
    mx.eval(model(mx.array([[3]]), cache=cache))  # one token: the profile's configs
    assert all(m.calls == {"custom": 4, "builtin": 10, "module": 2} for m in layers)
    one = model(mx.array([[PROMPT[0]]]))  # no cache, one token: the block, RoPE at offset 0
    kernelfleet.unpatch(model)
    assert close(model(mx.array([[PROMPT[0]]])), one) <= LOGIT_TOL
    assert all(m.calls["custom"] == 8 for m in layers)


def test_new_weights_after_patching_run_the_layers_own_code() -> None:
    """``load_weights`` replaces the views the block joined: the layer runs its own code, with the new
    weights."""
    model = build(LLAMA, 4, 64)
    report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64))
    other = build(LLAMA, 4, 64, seed=11)
    expected = logits(other, PROMPT)
    model.load_weights(list(tree_flatten(other.parameters())))
    got = logits(model, PROMPT)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(expected, got, strict=True))
    layers = by_kind(report)["quantized decoder layer"]
    assert all(m.calls == {"custom": 0, "builtin": 0, "module": 2} for m in layers)
    kernelfleet.unpatch(model)


def test_a_layer_the_block_does_not_take_keeps_the_projection_blocks() -> None:
    """A RoPE the block does not run in its graph (dynamic NTK scaling): the attention and the MLP are
    patched as their own blocks, as before the layer block."""
    config = {**LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    model = build(config, 4, 64)
    report = kernelfleet.patch(model, profile=profile_for(config, 4, 64))
    kinds = by_kind(report)
    assert "quantized decoder layer" not in kinds
    assert len(kinds["quantized attention projections"]) == 2 and len(kinds["quantized gated MLP"]) == 2
    kernelfleet.unpatch(model)


def test_a_layer_the_profile_leaves_to_its_other_patterns() -> None:
    """The block matches but the profile picks none of its kernels, only RoPE: the block is kept, and
    the layer's modules take their own patterns (RoPE the catalog's kernel, the projections MLX's op)."""
    spec = get_spec("rope")
    shapes = [(h, m, 32) for h in (4, 2) for m in (1, len(PROMPT))]  # q and k heads x positions x dims
    entries = [{"kernel": "rope", "shape": "x".join(map(str, shape)), "dtype": "float32",
                "config": spec.space(shape, "float32")[0]} for shape in shapes]
    model = build(LLAMA, 4, 64)
    stock = logits(model, PROMPT)
    report = kernelfleet.patch(model, profile={"schema": "kernelfleet-profile/1", "chip": "test",
                                               "entries": entries})
    kinds = {m.path: (m.kind, m.patched) for m in report.modules}
    assert kinds["model.layers.0"] == ("quantized decoder layer", False), str(report)
    assert kinds["model.layers.0.self_attn.rope"] == ("rope", True), str(report)
    assert all(close(a, b) <= LOGIT_TOL for a, b in zip(stock, logits(model, PROMPT), strict=True))
    kernelfleet.unpatch(model)


def _decode_profile(config: dict[str, Any], bits: int, group: int) -> dict[str, Any]:
    """qmv at 2 rows a warp for every quantized matmul at one token (so gate/up holds both rows of a pair)."""
    profile = profile_for(config, bits, group)
    for entry in profile["entries"]:
        if entry["config"]["path"] == "qmv":
            entry["config"] = {**entry["config"], "rpw": 2}
    return profile


def emulated_step(monkeypatch: pytest.MonkeyPatch, model: Any, profile: dict[str, Any]
                  ) -> tuple[mx.array, mx.array, list[str]]:
    """A decode step after PROMPT where the Metal emulator is the GPU: (stock's logits, the logits patched
    with ``profile``, the patched step's launches by kernel name without the hash). Skips the test where
    the emulator cannot run (it needs clang++)."""
    from kernelfleet.kernels.patch import runtime
    from kernelfleet.kernels.render.launch import capture, intercept
    from kernelfleet.kernels.testing.metal_emu import Emulator
    from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

    emu = MetalEmuBackend(Emulator(seed=0))
    if not emu.available():
        pytest.skip("the Metal emulator needs clang++")
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    mx.eval([c.state for c in cache])
    stock = model(mx.array([[11]]), cache=cache)
    mx.eval(stock)
    for c in cache:  # the step again, at the same position
        c.offset -= 1
    monkeypatch.setattr(runtime, "target", lambda: runtime.Target("Apple M3 Max", "metal"))
    # the decode step's own attention runs on CUDA only (model_decode.BACKENDS): here, its Metal rendering
    monkeypatch.setattr(model_decode, "BACKENDS", ("cuda", "metal"))
    runtime.clear_caches()
    kernelfleet.patch(model, profile=profile)
    try:
        with capture() as launches:
            model(mx.array([[11]]), cache=cache)
        for c in cache:
            c.offset -= 1
        with intercept(emu.launch):
            patched = model(mx.array([[11]]), cache=cache)
            mx.eval(patched)
    finally:
        kernelfleet.unpatch(model)
        runtime.clear_caches()
    return stock, patched, [r.rendered.name.rsplit("_", 1)[0] for r in launches]


def test_a_decode_step_with_custom_kernels_writes_the_epilogues(monkeypatch: pytest.MonkeyPatch) -> None:
    """With custom kernels (the Metal emulator as the GPU), a decode step's layer launches four quantized
    matmuls and the attention, with nothing between them but the KV cache's two writes: q/k/v's
    normalises x, rotates q and k (RoPE) and leaves q, k and v in attention's layout, the attention reads
    the cache's buffers (``model_decode``), o's adds the residual, gate/up's normalises that and computes
    the activation, down's adds the residual. The logits stay the stock model's."""
    stock, patched, names = emulated_step(monkeypatch, build(LLAMA, 4, 32), _decode_profile(LLAMA, 4, 32))
    # norm + q/k/v in heads + RoPE; attention; o + residual; norm + gate/up + activation; down + residual
    layer = ["kf_qmv_heads_rope_norm", "kf_decode_attention", "kf_qmv_residual", "kf_qmv_swiglu_norm",
             "kf_qmv_residual"]
    assert names == layer * 2 + ["kf_qmv"], names  # two layers, then the LM head
    assert close(stock, patched) <= LOGIT_TOL


def test_decode_steps_write_the_cache_as_mlx_lm_does_across_its_growth(monkeypatch: pytest.MonkeyPatch
                                                                        ) -> None:
    """Decode steps on the Metal emulator from position 254: the one-graph step (``model_decode``) writes
    the new keys and values into the cache's buffers at 254 and 255, the full cache's step at 256 takes
    mlx-lm's ``update_and_fetch`` (the buffers grow to 512) and the one-graph step runs again at 257. Each
    step's logits stay stock's, and the cache holds what stock's holds, position for position; a
    ``copy.deepcopy`` of the cache taken before the steps (its arrays share the buffers, as mlx-lm's prompt
    cache's copies do) keeps its contents. (Each step first runs with its launches recorded, which shows
    the path it takes, then again on the emulator at the same position.)"""
    import copy

    from kernelfleet.kernels.patch import runtime
    from kernelfleet.kernels.render.launch import capture, intercept
    from kernelfleet.kernels.testing.metal_emu import Emulator
    from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

    emu = MetalEmuBackend(Emulator(seed=0))
    if not emu.available():
        pytest.skip("the Metal emulator needs clang++")
    model = build(LLAMA, 4, 32)
    prompt = mx.array([[(7 * i) % 100 for i in range(254)]])
    caches = [make_prompt_cache(model) for _ in range(2)]
    for cache in caches:
        model(prompt, cache=cache)
        mx.eval([c.state for c in cache])
    stock_cache, cache = caches
    snapshot = copy.deepcopy(cache)
    before = [(c.keys * 1, c.values * 1) for c in cache]  # copies of the data (new buffers), not views
    mx.eval(before)
    monkeypatch.setattr(runtime, "target", lambda: runtime.Target("Apple M3 Max", "metal"))
    monkeypatch.setattr(model_decode, "BACKENDS", ("cuda", "metal"))
    runtime.clear_caches()
    tokens = [11, 23, 5, 42]
    attention_launches = []
    for token in tokens:
        want = model(mx.array([[token]]), cache=stock_cache)
        report = kernelfleet.patch(model, profile=_decode_profile(LLAMA, 4, 32))
        try:
            with capture() as launches:
                model(mx.array([[token]]), cache=cache)
            for c in cache:  # the capture wrote zeros at this position: the step again, at the same one
                c.offset -= 1
            attention_launches.append(sum(r.rendered.name.startswith("kf_decode_attention")
                                          for r in launches))
            with intercept(emu.launch):
                got = model(mx.array([[token]]), cache=cache)
                mx.eval(got, [c.state for c in cache])
            # both layers' steps on the emulator (each at a position the cache has room for) share one
            # attention + post graph, as their pre and post graphs are shared
            shared = {k for m in report.patched if m.router is not None for k in m.router.shared}
            assert len([k for k in shared if k[0] == "layer decode"]) == 1
        finally:
            kernelfleet.unpatch(model)
        assert close(want, got) <= LOGIT_TOL
        for mine, theirs in zip(cache, stock_cache, strict=True):
            assert mine.offset == theirs.offset and mine.keys.shape == theirs.keys.shape
            n = theirs.offset
            for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                assert mx.allclose(a[..., :n, :], b[..., :n, :], atol=1e-5).item()
    runtime.clear_caches()
    # positions 254 and 255 in the one graph; 256 grows the cache (mlx-lm's code); 257 in the one graph
    assert attention_launches == [2, 2, 0, 2]
    assert cache[0].keys.shape[2] == 512
    for copied, (keys, values) in zip(snapshot, before, strict=True):
        assert copied.offset == 254 and copied.keys.shape[2] == 256
        assert mx.array_equal(copied.keys, keys).item() and mx.array_equal(copied.values, values).item()


def test_the_decode_graph_keeps_to_one_sequence_and_the_measured_positions() -> None:
    """Past MAX_POSITIONS, with a mask, another cache class or dtype, or a full cache, a step keeps the
    block's path around mlx-lm's cache; a batch of two never gets the decode graph."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    post = lambda *a: a[0]  # noqa: E731  (never called: takes() alone)
    shared: dict[Any, Any] = {}

    def graph_of(shape: tuple[int, ...], backend: str) -> model_decode.DecodeGraph | None:
        return model_decode.decode_graph(post, shape, mx.float16, (4, 2, 32), backend,  # type: ignore[arg-type]
                                         lambda k, build: shared.setdefault(k, build()), ("test",))

    assert graph_of((2, 1, 128), "cuda") is None
    assert graph_of((1, 1, 128), "metal") is None
    graph = graph_of((1, 1, 128), "cuda")
    assert graph is not None
    cache = KVCache()
    cache.update_and_fetch(*(mx.zeros((1, 2, 3, 32), mx.float16) for _ in range(2)))
    assert graph.takes(cache, None) and not graph.takes(cache, "causal")
    cache.offset = model_decode.MAX_POSITIONS
    cache.keys = cache.values = mx.zeros((1, 2, 2 * model_decode.MAX_POSITIONS, 32), mx.float16)
    assert not graph.takes(cache, None)
    cache.offset = cache.keys.shape[2] - 1 - model_decode.MAX_POSITIONS
    assert graph.takes(cache, None)
    cache.keys = cache.keys.astype(mx.float32)
    assert not graph.takes(cache, None)
    full = KVCache()
    full.update_and_fetch(*(mx.zeros((1, 2, 256, 32), mx.float16) for _ in range(2)))
    assert not graph.takes(full, None) and not graph.takes(RotatingKVCache(64), None)


@pytest.mark.parametrize(("chip", "backend", "note"), [("NVIDIA H200", "cuda", True),
                                                       ("Apple M3 Max", "metal", False)])
def test_the_report_says_where_the_block_runs_its_own_decode_attention(
        monkeypatch: pytest.MonkeyPatch, chip: str, backend: str, note: bool) -> None:
    """On CUDA the block's report line says it runs its own decode attention; on Metal, where it does
    not (``model_decode.BACKENDS``), the line says nothing of it."""
    from kernelfleet.kernels.patch import runtime

    monkeypatch.setattr(runtime, "target", lambda: runtime.Target(chip, backend))
    runtime.clear_caches()
    model = build(LLAMA, 4, 64)
    try:
        report = kernelfleet.patch(model, profile=profile_for(LLAMA, 4, 64))
        layers = by_kind(report)["quantized decoder layer"]
        assert all(m.patched for m in layers)
        assert (model_decode.REPORT_NOTE in str(report)) is note, str(report)
    finally:
        kernelfleet.unpatch(model)
        runtime.clear_caches()


def runner_ups(body: dict[str, Any], speedup: float) -> dict[str, Any]:
    """``body`` where the built-in won alone at every M=1 quantized matmul, each entry keeping its qmv config
    as ``custom`` at ``speedup`` over the built-in (as a coordinator's profile records its fastest custom
    config: :func:`kernelfleet.service.profiles.best_custom`)."""
    entries = []
    for e in body["entries"]:
        one = e["kernel"] == "quantized_matmul" and e["shape"].startswith("1x")
        entries.append({**e, "config": {"variant": "builtin"}, "config_key": "builtin", "speedup": 1.0,
                        "custom": {"config": e["config"], "speedup": speedup}} if one else e)
    return {**body, "entries": entries}



def test_fused_launches_take_the_runner_up_where_the_built_in_won_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the built-in won alone at M=1, q/k/v's and gate/up's launches (the ones that do the work around
    them) take the fastest custom config within FUSED_MIN_SPEEDUP of the built-in; o and down keep their
    pick, the built-in, with MLX adding the residual. Slower than that, the layer runs mlx-lm's code."""
    model, body = build(LLAMA, 4, 32), _decode_profile(LLAMA, 4, 32)
    stock, patched, names = emulated_step(monkeypatch, model, runner_ups(body, 0.95))
    assert names == ["kf_qmv_heads_rope_norm", "kf_decode_attention", "kf_qmv_swiglu_norm"] * 2, names
    assert close(stock, patched) <= LOGIT_TOL
    _, _, names = emulated_step(monkeypatch, model, runner_ups(body, 0.85))
    assert names == [], names
