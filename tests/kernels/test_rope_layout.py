"""rope in the layout attention layers hold (``heads_inner``): x is ``(batch, heads, L, Dh)``, the
transpose of a row-contiguous ``(batch, L, heads, Dh)`` projection, as mlx-lm hands it to ``nn.RoPE``.
The kernel reads that layout where it lies and hands back the same transposed view; its values must
equal the float32 reference's and the catalog layout's, position by position (positions run along
axis 2 of the view, axis 1 of the memory)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.kernels.catalog import get_spec, rope_kernel
from kernelfleet.kernels.spec import BadShape
from kernelfleet.kernels.testing.metal_emu import Emulator
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend, intercept

B, L, HEADS, DH = 2, 7, 3, 32
OFFSET = 11


def _attention_view(dtype: mx.Dtype) -> mx.array:
    projected = mx.random.normal((B, L, HEADS * DH), key=mx.random.key(3)).astype(dtype)
    return projected.reshape(B, L, HEADS, DH).transpose(0, 2, 1, 3)  # as mlx-lm's attention does


def _configs(dtype: str) -> list[dict[str, int]]:
    """Per vector width, its first config and its first with two items per thread."""
    space = get_spec("rope").space((B * HEADS, L, DH), dtype)
    picked: dict[tuple[int, bool], dict[str, int]] = {}
    for c in space:
        picked.setdefault((c["vec"], c["ipt"] > 1), c)
    assert len({vec for vec, _ in picked}) >= 3
    return list(picked.values())


def _check(run: object) -> None:
    shape = (B * HEADS, L, DH)
    off = mx.array([OFFSET], mx.int32)
    for dtype, mx_type in (("float32", mx.float32), ("bfloat16", mx.bfloat16)):  # vec up to 4 / 8
        x = _attention_view(mx_type)
        ref = rope_kernel.reference([x, off])[0]
        tol = get_spec("rope").tolerances[dtype]
        for config in _configs(dtype):
            for heads_inner in (True, False):
                fn = rope_kernel.make(config, "cuda" if run is None else "metal", shape, dtype,
                                      heads_inner=heads_inner)
                if run is None:
                    out = fn([x, off])[0]
                    mx.eval(out)
                else:
                    with intercept(run):  # type: ignore[arg-type]
                        out = fn([x, off])[0]
                        mx.eval(out)
                assert out.shape == x.shape and out.dtype == mx_type
                err = mx.abs(out.astype(mx.float32) - ref).max().item()
                assert err <= tol.atol + tol.rtol * mx.abs(ref).max().item(), \
                    f"{dtype} {config} heads_inner={heads_inner}: max abs error {err}"


def test_rope_reads_the_attention_layout_in_the_metal_emulator() -> None:
    backend = MetalEmuBackend(Emulator(seed=0))
    if not backend.available():
        pytest.skip("the Metal emulator needs clang++")
    _check(backend.launch)


@pytest.mark.cuda
def test_rope_reads_the_attention_layout_on_cuda() -> None:
    if not mx.cuda.is_available():
        pytest.skip("MLX CUDA backend not available on this machine")
    with mx.stream(mx.gpu):
        _check(None)


def test_the_builtin_takes_the_layout_flag() -> None:
    """The patch passes ``heads_inner`` to whichever path the profile picks: the built-in's values do
    not depend on it."""
    x = _attention_view(mx.float32)
    off = mx.array([OFFSET], mx.int32)
    a = rope_kernel.builtin([x, off], heads_inner=True)[0]
    b = rope_kernel.builtin([x, off])[0]
    assert mx.array_equal(a, b).item()
    assert mx.abs(a - rope_kernel.reference([x, off])[0]).max().item() < 1e-4


def test_the_attention_layout_needs_heads_positions_and_head_dim() -> None:
    fn = rope_kernel.make(_configs("float32")[0], "metal", (1, L, DH), "float32", heads_inner=True)
    with pytest.raises(BadShape, match="heads_inner takes"):
        fn([mx.zeros((L, DH)), mx.array([0], mx.int32)])


def test_the_catalog_measures_rope_in_the_attention_layout() -> None:
    """make_inputs hands the tuner the view attention holds, and the catalog's build reads it in place:
    the same values as the row-contiguous path, in the emulator."""
    spec = get_spec("rope")
    x, off = spec.make_inputs((HEADS, L, DH), "float32", 0)
    assert x.shape == (1, HEADS, L, DH)  # (batch, heads, L, Dh) as attention holds it
    backend = MetalEmuBackend(Emulator(seed=0))
    if not backend.available():
        pytest.skip("the Metal emulator needs clang++")
    config = _configs("float32")[-1]
    with intercept(backend.launch):
        held = spec.build(config, "metal", (HEADS, L, DH), "float32")([x, off])[0]
        plain = rope_kernel.make(config, "metal", (HEADS, L, DH), "float32")([mx.contiguous(x), off])[0]
        mx.eval(held, plain)
    assert mx.abs(held - plain).max().item() == 0.0
    assert mx.abs(held - rope_kernel.reference([x, off])[0]).max().item() < 1e-4
