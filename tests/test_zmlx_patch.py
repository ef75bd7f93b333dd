"""``kernelfleet.zmlx.patch`` on a small mlx-lm Llama (random weights): after it, every module zmlx
patched holds the pulled profile's threadgroup (or the MLX built-in, or zmlx's default where the
profile has no confident entry, as the report says), and no in-process autotune runs: a forward pass
is captured off a Mac (``kernels.zmlx_capture``) with zmlx's timing functions replaced by ones that
fail if called, and every launch it makes uses the profile's threadgroup."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest

from kernelfleet.kernels.patch import profile_file
from kernelfleet.kernels.spec import config_key
from kernelfleet.kernels.zmlx.capture import capture

llama = pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is not installed")

CHIP = "Apple M3 Max"
HIDDEN, INTER = 64, 160


def entry(kernel: str, shape: str, config: dict[str, Any], *,
          confidence: float | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"kernel": kernel, "shape": shape, "dtype": "float16", "config": config,
                         "config_key": config_key(config), "median_us": 10.0, "speedup": 1.2}
    if confidence is None:
        e.update(predicted=False, runs=3, workers=2)
    else:
        e.update(predicted=True, confidence=confidence, basis=[{"chip": "Apple M3 Pro"}])
    return e


@pytest.fixture
def model() -> Any:
    args = llama.ModelArgs(model_type="llama", hidden_size=HIDDEN, num_hidden_layers=3,
                           intermediate_size=INTER, num_attention_heads=4, num_key_value_heads=2,
                           rms_norm_eps=1e-5, vocab_size=97)
    m = llama.Model(args)
    m.set_dtype(mx.float16)
    return m


@pytest.fixture
def no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """zmlx's in-process timing (the patched norms' ``_autotune_threadgroup`` and
    ``zmlx.autotune.autotune_kernel``) fails the test if anything calls it."""
    import zmlx.autotune as za
    import zmlx.patch._modules as zpm

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("zmlx timed threadgroups in-process")

    monkeypatch.setattr(zpm, "_autotune_threadgroup", fail)
    monkeypatch.setattr(za, "autotune_kernel", fail)


def forward_launches(m: Any, tokens: int) -> Counter[tuple[str, int]]:
    with capture() as records:
        mx.eval(m(mx.array([list(range(1, tokens + 1))])))
    return Counter((r.name.split("_D")[0], r.threadgroup[0]) for r in records)


def test_patch_pins_every_module_to_the_installed_profile(
    model: Any, no_timing: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zmlx.patch._modules import ZMLXRMSNorm

    from kernelfleet.zmlx import patch

    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path))
    profile_file.write({"schema": profile_file.SCHEMA, "chip": CHIP, "mlx_version": None, "version": 1,
                        "etag": "e", "confidence_threshold": 0.6, "entries": [
                            entry("zmlx_rmsnorm", f"1x{HIDDEN}", {"tg": 64}),
                            entry("zmlx_add_rmsnorm", f"1x{HIDDEN}", {"tg": 128}, confidence=0.8),
                            entry("zmlx_swiglu", f"1x{INTER}", {"variant": "builtin"}),
                            # a prefill entry only: decode (the default) ignores it
                            entry("zmlx_rmsnorm", f"8x{HIDDEN}", {"tg": 1024}),
                        ]})
    report = patch(model, profile=CHIP, patterns=["swiglu_mlp", "rmsnorm", "residual_norm"])

    assert report.zmlx_patched == 3 * 4 + 1  # per layer: mlp, 2 norms, the block; the final norm
    norms = [m for _, m in model.named_modules() if isinstance(m, ZMLXRMSNorm)]
    assert len(norms) == 7 and all(n._resolved_tg == 64 and not n._auto for n in norms)
    by_pattern = Counter((p.pattern, p.applied) for p in report.pinned)
    assert by_pattern == {("rmsnorm", "tg=64"): 7, ("residual_norm", "tg=128"): 3,
                          ("swiglu_mlp", "MLX built-in (the block's own __call__)"): 3}
    assert report.kept_default == []
    assert "measured (3 runs, 2 workers) at 1x64" in report.summary()
    assert "predicted (confidence 0.80) at 1x64" in report.summary()

    # decode: the final norm and the blocks' attention norms run zmlx's rmsnorm at the profile's 64,
    # each block's residual add + norm zmlx's add_rms_norm at 128, the MLPs MLX's own ops
    assert forward_launches(model, 1) == {("kk_rmsnorm", 64): 4, ("kk_add_rmsnorm", 128): 3}


def test_tokens_choose_the_entries_and_missing_ones_keep_zmlx_s_default(model: Any, no_timing: None) -> None:
    from kernelfleet.zmlx import patch

    body = {"schema": profile_file.SCHEMA, "chip": CHIP, "confidence_threshold": 0.6, "entries": [
        entry("zmlx_rmsnorm", f"1x{HIDDEN}", {"tg": 64}),
        entry("zmlx_rmsnorm", f"8x{HIDDEN}", {"tg": 512}),
        entry("zmlx_add_rmsnorm", f"8x{HIDDEN}", {"tg": 32}, confidence=0.3),  # below the threshold
        entry("zmlx_swiglu", f"8x{INTER}", {"tg": 512}),  # MetalKernel's default for 8 x 160 is 512 too
    ]}
    report = patch(model, profile=body, tokens=[8], patterns=["swiglu_mlp", "rmsnorm", "residual_norm"])
    pinned = Counter((p.pattern, p.applied) for p in report.pinned)
    assert pinned == {("rmsnorm", "tg=512"): 7, ("swiglu_mlp", "tg=512"): 3}
    kept = {(p.pattern, p.applied, p.basis) for p in report.kept_default}
    assert kept == {("residual_norm", "zmlx default (tg=256)",
                     f"no confident profile entry for zmlx_add_rmsnorm 8x{HIDDEN} float16")}
    assert "3 x residual_norm (zmlx_add_rmsnorm, D=64, float16): kept default" in report.summary()
    assert forward_launches(model, 8) == {("kk_rmsnorm", 512): 4, ("kk_add_rmsnorm", 256): 3,
                                          ("kk_swiglu2_fwd", 512): 3}


def test_swiglu_threadgroup_zmlx_cannot_take_is_reported(model: Any, no_timing: None) -> None:
    from kernelfleet.zmlx import patch

    body = {"schema": profile_file.SCHEMA, "chip": CHIP,
            "entries": [entry("zmlx_swiglu", f"1x{INTER}", {"tg": 32})]}
    report = patch(model, profile=body, patterns=["swiglu_mlp"])
    assert report.pinned == [] and len(report.kept_default) == 3
    assert all("the profile's tg=32 cannot be passed (swiglu2 takes no threadgroup)" in p.applied
               for p in report.kept_default)
    assert forward_launches(model, 1) == {("kk_swiglu2_fwd", 128): 3}  # MetalKernel: largest 2^k <= 160


def test_bad_profile_and_tokens_get_clear_errors(
    model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelfleet.zmlx import PatchError, patch

    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path))
    with pytest.raises(PatchError, match="no KernelFleet profile is installed for 'Apple M2'.*pull"):
        patch(model, profile="Apple M2")
    with pytest.raises(PatchError, match="not a KernelFleet profile"):
        patch(model, profile={"schema": "other", "entries": []})
    with pytest.raises(PatchError, match="tokens must be positive"):
        patch(model, profile={"schema": profile_file.SCHEMA, "entries": []}, tokens=[0])


class Attention(nn.Module):
    """Manual attention exposing ``softmax`` (what zmlx's softmax pattern matches), and a LayerNorm."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.scale = dims ** -0.5
        self.q_proj = nn.Linear(dims, dims)
        self.softmax = mx.softmax
        self.norm = nn.LayerNorm(dims)


def test_softmax_looks_up_its_width_per_call_and_layernorm_goes_back_to_the_builtin(no_timing: None) -> None:
    from kernelfleet.zmlx import patch

    model = nn.Sequential(Attention(64))
    model.set_dtype(mx.float16)
    body = {"schema": profile_file.SCHEMA, "chip": CHIP, "entries": [
        entry("zmlx_softmax", "4x64", {"tg": 32}), entry("zmlx_softmax", "4x128", {"tg": 64}),
        entry("zmlx_layernorm", "1x64", {"variant": "builtin"}),
    ]}
    weight = model.layers[0].norm.weight
    report = patch(model, profile=body, patterns=["softmax", "layernorm"])
    attn = model.layers[0]
    assert type(attn.norm) is nn.LayerNorm and attn.norm.weight is weight  # the built-in, same weights
    assert {(p.pattern, p.applied) for p in report.pinned} == {("layernorm", "MLX built-in"),
                                                               ("softmax", "per-call table (2 entries)")}
    widths = {(4, 64): 32, (4, 128): 64, (2, 64): 32, (4, 96): 256}  # nearest rows of that width; else 256
    for (rows, width), tg in widths.items():
        with capture() as records:
            attn.softmax(mx.zeros((rows, width), dtype=mx.float16), axis=-1)
        assert [(r.name, r.threadgroup[0]) for r in records] == [(f"kk_softmax_D{width}_TG{tg}", tg)]
    with capture() as records:  # not the last axis: MLX's softmax, no zmlx launch
        attn.softmax(mx.zeros((4, 64), dtype=mx.float16), axis=0)
    assert records == []
