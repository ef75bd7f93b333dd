"""rope in the layout attention layers hold (``heads_inner``): x is ``(batch, heads, L, Dh)``, the
transpose of a row-contiguous ``(batch, L, heads, Dh)`` projection, as mlx-lm hands it to ``nn.RoPE``.
The kernel reads that layout where it lies and hands back the same transposed view; its values must
equal the float32 reference's and the catalog layout's, position by position (positions run along
axis 2 of the view, axis 1 of the memory)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.kernels import rope_kernel
from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.spec import BadShape
from kernelfleet.kernels.testing.emu_backend import MetalEmuBackend, intercept
from kernelfleet.kernels.testing.metal_emu import Emulator

B, L, HEADS, DH = 2, 7, 3, 32
OFFSET = 11


def _attention_view(dtype: mx.Dtype) -> mx.array:
    projected = mx.random.normal((B, L, HEADS * DH), key=mx.random.key(3)).astype(dtype)
    return projected.reshape(B, L, HEADS, DH).transpose(0, 2, 1, 3)  # as mlx-lm's attention does


def _configs() -> list[dict[str, int]]:
    space = get_spec("rope").space((B * HEADS, L, DH), "float32")
    return [c for c in space if c["ipt"] in (1, 2)][:4]  # several vector widths and unrolls


def _check(run: object) -> None:
    x = _attention_view(mx.float32)
    off = mx.array([OFFSET], mx.int32)
    ref = rope_kernel.reference([x, off])[0]
    shape = (B * HEADS, L, DH)
    for config in _configs():
        for heads_inner in (True, False):
            fn = rope_kernel.make(config, "cuda" if run is None else "metal", shape, "float32",
                                  heads_inner=heads_inner)
            if run is None:
                out = fn([x, off])[0]
                mx.eval(out)
            else:
                with intercept(run):  # type: ignore[arg-type]
                    out = fn([x, off])[0]
                    mx.eval(out)
            assert out.shape == x.shape
            err = mx.abs(out - ref).max().item()
            assert err < 1e-4, f"{config} heads_inner={heads_inner}: max abs error {err}"


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


def test_the_builtin_and_reference_take_the_layout_flag() -> None:
    """The patch passes ``heads_inner`` to whichever path the profile picks: the built-in's values do
    not depend on it."""
    x = _attention_view(mx.float32)
    off = mx.array([OFFSET], mx.int32)
    a = rope_kernel.builtin([x, off], heads_inner=True)[0]
    b = rope_kernel.builtin([x, off])[0]
    assert mx.array_equal(a, b).item()
    assert mx.abs(a - rope_kernel.reference([x, off], heads_inner=True)[0]).max().item() < 1e-4


def test_the_attention_layout_needs_four_dimensions() -> None:
    fn = rope_kernel.make(_configs()[0], "metal", (6, L, DH), "float32", heads_inner=True)
    with pytest.raises(BadShape, match="heads_inner takes"):
        fn([mx.zeros((6, L, DH)), mx.array([0], mx.int32)])
