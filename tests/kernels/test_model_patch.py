"""``kernelfleet.patch`` on tiny mlx-lm models built from ``ModelArgs`` (CPU).

The profile holds a custom config (the kernel's default) at exactly the shapes that
:func:`kernelfleet.kernels.patch.model_shapes.derive` plans for the model's config, so a campaign from that
config would tune what the patched model looks up. On CPU custom kernels cannot run, so the patched
calls run the catalog's built-ins through ``kernelfleet.kernels.patch.runtime.run``; the tests check that
every patched call goes that way (the routers' counts and the shapes they met) and that the logits
match the unpatched model's, for a prefill and a decode step with a KV cache.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

mlx_lm = pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

import kernelfleet  # noqa: E402
from kernelfleet.kernels.catalog import get_spec  # noqa: E402
from kernelfleet.kernels.patch import runtime  # noqa: E402
from kernelfleet.kernels.patch.model_patterns import Router  # noqa: E402
from kernelfleet.kernels.patch.model_shapes import ARCHITECTURES, derive  # noqa: E402
from kernelfleet.kernels.patch.profile_view import ROUTED_MIN_GAIN_US, load  # noqa: E402
from kernelfleet.kernels.render.launch import capture  # noqa: E402
from kernelfleet.kernels.spec import BUILTIN, parse_shape  # noqa: E402

PROMPT = 7
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 101,
         "rope_theta": 500000.0, "tie_word_embeddings": False}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 32,
             "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [1],
             "moe_intermediate_size": 32, "rms_norm_eps": 1e-6, "vocab_size": 101, "rope_theta": 1e6,
             "tie_word_embeddings": False, "max_position_embeddings": 512, "norm_topk_prob": True}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 101,
          "query_pre_attn_scalar": 32, "sliding_window": 512, "sliding_window_pattern": 2,
          "rope_scaling": None}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 48,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8,
           "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "vocab_size": 101}


def build(config: dict[str, Any]) -> Any:
    module = importlib.import_module(f"mlx_lm.models.{ARCHITECTURES[config['model_type']].mlx_module}")
    mx.random.seed(3)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def forward(model: Any) -> list[mx.array]:
    """Logits of a prefill of PROMPT tokens and of one decode step after it, with a KV cache."""
    tokens = mx.array([[5, 17, 3, 99, 42, 8, 61]])
    cache = make_prompt_cache(model)
    prefill = model(tokens, cache=cache)
    decode = model(mx.array([[11]]), cache=cache)
    mx.eval(prefill, decode)
    return [prefill, decode]


def profile_for(config: dict[str, Any], builtin: tuple[str, ...] = ()) -> tuple[dict[str, Any], set[tuple]]:
    """A profile with a custom config (the kernel's default) at every planned shape; ``builtin``
    kernels get the built-in there instead."""
    plan = derive(config, decode=(1,), prefill=(PROMPT,), dtypes=["float32"])
    entries, keys = [], set()
    for kernel, shapes in plan.kernel_shapes.items():
        for shape in shapes:
            spec = get_spec(kernel)
            config_ = BUILTIN if kernel in builtin else spec.default_config(parse_shape(shape), "float32")
            entries.append({"kernel": kernel, "shape": shape, "dtype": "float32", "config": dict(config_)})
            keys.add((kernel, shape, "float32"))
    return {"schema": "kernelfleet-profile/1", "chip": "test", "entries": entries}, keys


def seen(report: Any) -> set[tuple]:
    return {k for m in report.patched for k in m.router.seen}


@pytest.mark.parametrize("config, kinds", [
    (LLAMA, {"residual add + rmsnorm": 2, "rmsnorm": 3, "rope": 2, "swiglu": 2}),
    (QWEN3_MOE, {"residual add + rmsnorm": 2, "rmsnorm": 3 + 4, "rope": 2, "swiglu": 1,
                 "swiglu (experts)": 1, "moe router + combine": 1}),
    (GEMMA3, {"geglu": 2, "rope": 2}),  # a sliding-window layer (local RoPE base) and a global one
], ids=["llama", "qwen3_moe", "gemma3"])
def test_patch_routes_the_planned_calls_and_keeps_the_logits(config: dict[str, Any],
                                                             kinds: dict[str, int]) -> None:
    model = build(config)
    stock = forward(model)
    classes = {path: type(m) for path, m in model.named_modules()}
    profile, planned = profile_for(config)

    report = kernelfleet.patch(model, profile=profile)
    got = {k: sum(1 for m in report.patched if m.kind == k) for k in kinds}
    assert got == kinds, str(report)
    assert not report.kept, str(report)
    assert all(m.reason.startswith("profile: ") and "custom at" in m.reason for m in report.patched)
    assert "post_attention_layernorm" not in " ".join(m.path for m in report.modules)  # fused into blocks
    patched = forward(model)
    for a, b in zip(stock, patched, strict=True):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item(), float(mx.abs(a - b).max())
    # every patched call took the kernel path (the profile holds every planned shape; on CPU the
    # kernels execute as the catalog's built-ins), and the calls met exactly the planned shapes
    assert all(m.calls["custom"] > 0 and m.calls["builtin"] == 0 and m.calls["module"] == 0
               for m in report.patched), [(m.path, m.calls) for m in report.patched]
    assert seen(report) == planned

    kernelfleet.unpatch(model)
    assert {path: type(m) for path, m in model.named_modules()} == classes
    assert not hasattr(model, "_kernelfleet_patch")
    after = forward(model)
    for a, b in zip(stock, after, strict=True):
        assert mx.array_equal(a, b).item()


def test_the_profile_decides_what_is_kept() -> None:
    model = build(LLAMA)
    profile, _ = profile_for(LLAMA, builtin=("rmsnorm", "swiglu"))
    profile["entries"] = [e for e in profile["entries"] if e["kernel"] != "rope"]
    report = kernelfleet.patch(model, profile=profile)
    kept = {m.kind: m.reason for m in report.kept}
    assert set(kept) == {"rmsnorm", "swiglu", "rope"}, str(report)
    assert kept["rmsnorm"].startswith("profile: rmsnorm: the built-in at every tuned shape (1x64, 7x64)")
    assert kept["rope"] == "rope: untuned and no confident prediction"
    assert {m.kind for m in report.patched} == {"residual add + rmsnorm"}
    assert "2 modules patched, 7 kept" in str(report)
    kernelfleet.unpatch(model)


def test_custom_picks_that_save_too_little_keep_the_module() -> None:
    """A measured custom pick is used only where it is faster than the built-in beyond the noise and
    saves at least ``min_gain_us`` a call (what a patched call adds on the host); the report says why."""
    model = build(LLAMA)
    profile, _ = profile_for(LLAMA)
    for e in profile["entries"]:
        if e["kernel"] == "swiglu":  # 10 µs -> 10.2 µs: within the noise
            e.update(median_us=10.0, speedup=1.02)
        elif e["kernel"] == "rope":  # faster beyond the noise, but saves 2 µs a call
            e.update(median_us=10.0, speedup=1.2)
        elif e["kernel"] == "rmsnorm":  # a coordinator's interval that reaches below 1
            e.update(median_us=10.0, speedup=2.0, speedup_interval=[0.97, 2.5])
        else:  # saves 40 µs a call
            e.update(median_us=40.0, speedup=2.0, speedup_interval=[1.8, 2.2])
    report = kernelfleet.patch(model, profile=profile)
    kept = {m.kind: m.reason for m in report.kept}
    assert set(kept) == {"swiglu", "rope", "rmsnorm"}, str(report)
    assert all("(not faster beyond the noise)" in kept[k] for k in ("swiglu", "rmsnorm"))
    assert f"(gains under {ROUTED_MIN_GAIN_US:g} µs a call)" in kept["rope"]
    assert {m.kind for m in report.patched} == {"residual add + rmsnorm"}
    kernelfleet.unpatch(model)
    # min_gain_us=0: every pick faster beyond the noise is used
    report = kernelfleet.patch(model, profile=profile, min_gain_us=0)
    assert {m.kind for m in report.kept} == {"swiglu", "rmsnorm"}, str(report)
    kernelfleet.unpatch(model)


def test_predictions_below_the_confidence_threshold_keep_the_module() -> None:
    model = build(LLAMA)
    profile, _ = profile_for(LLAMA)
    for e in profile["entries"]:
        e.update(predicted=True, confidence=0.5 if e["kernel"] == "swiglu" else 0.9)
    report = kernelfleet.patch(model, profile=profile)
    assert {m.kind for m in report.kept} == {"swiglu"}
    kernelfleet.unpatch(model)
    assert {m.kind for m in kernelfleet.patch(model, profile=profile, min_confidence=0.4).kept} == set()
    kernelfleet.unpatch(model)


def test_mixtral_router_patched_where_the_catalog_takes_its_shapes() -> None:
    """Mixtral routes over 8 experts: below topk_gating_softmax's 32, so the plan leaves the router's
    top-k out and the block runs the built-in top-k with the tuned combine."""
    model = build(MIXTRAL)
    stock = forward(model)
    profile, planned = profile_for(MIXTRAL)
    assert not any(k[0] == "topk_gating_softmax" for k in planned)
    report = kernelfleet.patch(model, profile=profile)
    router = next(m for m in report.patched if m.kind == "moe router + combine")
    assert "topk_gating_softmax: untuned" in router.reason and "moe_combine: custom at" in router.reason
    for a, b in zip(stock, forward(model), strict=True):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()
    assert {k for k in seen(report) if k[0] != "topk_gating_softmax"} == planned
    kernelfleet.unpatch(model)


def test_a_second_model_in_the_process_stays_stock() -> None:
    """mlx-lm shares one SwiGLU() between every SwitchGLU: patching one model must not change another."""
    patched, other = build(QWEN3_MOE), build(QWEN3_MOE)
    shared = other.model.layers[0].mlp.switch_mlp.activation
    profile, _ = profile_for(QWEN3_MOE)
    report = kernelfleet.patch(patched, profile=profile)
    assert patched.model.layers[0].mlp.switch_mlp.activation is not shared
    assert other.model.layers[0].mlp.switch_mlp.activation is shared
    forward(other)
    assert sum(sum(m.calls.values()) for m in report.patched) == 0
    with pytest.raises(ValueError, match="already patched"):
        kernelfleet.patch(patched, profile=profile)
    kernelfleet.unpatch(patched)
    assert patched.model.layers[0].mlp.switch_mlp.activation is shared


def test_router_runs_the_profile_config_only_at_its_exact_shape() -> None:
    """The per-call choice where custom kernels can run: the profile's config at a tuned shape, the
    built-in elsewhere (on CPU both execute as the built-in, which this test does not measure)."""
    profile, _ = profile_for(LLAMA)
    router = Router(load(profile, "test"), gpu=True)
    x, w = mx.ones((7, 64)), mx.ones((64,))
    router.run("rmsnorm", [x, w], (7, 64), eps=1e-5)
    router.run("rmsnorm", [mx.ones((3, 64)), w], (3, 64), eps=1e-5)
    assert (router.custom, router.builtin) == (1, 1)


def test_router_resolves_what_runs_once_per_shape_and_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where custom kernels run (CUDA here, launches captured): each call launches the profile's config,
    but what runs is resolved on the first call per (kernel, shape, dtype, parameters) only."""
    monkeypatch.setattr(runtime, "target", lambda: runtime.Target("test", "cuda"))
    resolved: list[tuple[Any, ...]] = []
    real = runtime.resolve

    def counted(*args: Any) -> Any:
        resolved.append(args[:2] + (args[4],))
        return real(*args)
    monkeypatch.setattr(runtime, "resolve", counted)
    profile, _ = profile_for(LLAMA)
    router = Router(load(profile, "test"), gpu=True)
    x, w = mx.ones((7, 64)), mx.ones((64,))
    with capture() as launches:
        for _ in range(3):
            router.run("rmsnorm", [x, w], (7, 64), eps=1e-5)
        router.run("rmsnorm", [x, w], (7, 64), eps=1e-6)
    assert len(launches) == 4 and router.custom == 4
    assert resolved == [("rmsnorm", (7, 64), {"eps": 1e-5}), ("rmsnorm", (7, 64), {"eps": 1e-6})]
    config = load(profile, "test").choice("rmsnorm", (7, 64), "float32")
    assert config and launches[0].launch.threadgroup[0] == config["tg"]


def test_calls_at_shapes_the_profile_does_not_hold_run_the_modules_own_code() -> None:
    """A profile from a prefill-only campaign: the prefill takes the kernel path, decode steps (one
    row) run each module's own code, and the logits are the stock ones."""
    model = build(QWEN3_MOE)
    stock = forward(model)
    plan = derive(QWEN3_MOE, decode=(), prefill=(PROMPT,), dtypes=["float32"])
    entries = [{"kernel": k, "shape": s, "dtype": "float32",
                "config": get_spec(k).default_config(parse_shape(s), "float32")}
               for k, shapes in plan.kernel_shapes.items() for s in shapes]
    profile = {"schema": "kernelfleet-profile/1", "chip": "t", "entries": entries}
    report = kernelfleet.patch(model, profile=profile)
    assert not report.kept
    for a, b in zip(stock, forward(model), strict=True):
        assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()
    assert all(m.calls["custom"] > 0 and m.calls["module"] > 0 for m in report.patched), \
        [(m.path, m.calls) for m in report.patched]
    assert all(k[1].split("x")[0] != "1" for k in seen(report))  # no kernel run at a decode row count
    kernelfleet.unpatch(model)


def test_no_profile_keeps_everything(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path))
    model = build(LLAMA)
    report = kernelfleet.patch(model)
    assert not report.patched and "no pulled profile for" in report.profile
    kernelfleet.unpatch(model)
