from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelfleet.kernels.render import cuda as render_cuda
from kernelfleet.kernels.render import dialect
from kernelfleet.kernels.render import metal as render_metal
from kernelfleet.kernels.render.dialect import DialectError, float_literal, render


def test_both_backends_spell_every_token() -> None:
    assert set(render_metal.TOKENS) == set(dialect.VOCABULARY)
    assert set(render_cuda.TOKENS) == set(dialect.VOCABULARY)


@pytest.mark.parametrize("helper", dialect.HELPERS)
def test_both_preludes_define_every_helper(helper: str) -> None:
    assert re.search(rf"\b{helper}\b", render_metal.PRELUDE)
    assert re.search(rf"\b{helper}\b", render_cuda.PRELUDE)


def test_render_substitutes_whole_identifiers_only() -> None:
    body = "float a = KF_EXP(x); KF_BARRIER; uint i = KF_TID; int KF_TIDE_x = 0;"
    with pytest.raises(DialectError, match="KF_TIDE_x"):
        render(body, "metal")
    body = "float a = KF_EXP(x); KF_BARRIER; unsigned i = KF_TID;"
    metal = render(body, "metal")
    cuda = render(body, "cuda")
    assert "metal::precise::exp(x)" in metal and "thread_position_in_threadgroup.x" in metal
    assert "threadgroup_barrier(mem_flags::mem_threadgroup)" in metal
    assert "expf(x)" in cuda and "threadIdx.x" in cuda and "__syncthreads()" in cuda
    assert "KF_" not in metal and "KF_" not in cuda


def test_metal_indices_are_mlx_attribute_names() -> None:
    # MLX adds [[attribute]] parameters only for these exact names found in the source text.
    attrs = {"thread_position_in_threadgroup", "threadgroup_position_in_grid", "thread_position_in_grid",
             "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup"}
    rendered = render("KF_TID KF_GROUP KF_GID KF_LANE KF_WARP", "metal")
    assert all(a in rendered for a in attrs)
    assert "#define" not in render_metal.PRELUDE


def test_values_and_float_literals() -> None:
    assert float_literal(1e-5) == "1e-05f"
    assert float_literal(1.0) == "1.0f"
    assert float_literal(10000) == "10000.0f"
    assert render("x * ${EPS}", "cuda", {"EPS": "1e-05f"}) == "x * 1e-05f"
    with pytest.raises(DialectError, match="EPS"):
        render("x * ${EPS}", "cuda", {})
    with pytest.raises(DialectError):
        float_literal(float("inf"))


def test_source_version_depends_on_sources(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("BODY = 1")
    v1 = dialect.source_version(str(a))
    a.write_text("BODY = 2")
    assert dialect.source_version(str(a)) != v1


def test_cuda_sources_are_compacted() -> None:
    """MLX's CUDA backend hashes a kernel's whole source on every launch, so the CUDA rendering drops
    comments, indentation and blank lines (the text nvcc and NVRTC compile, ``test_cuda_render``), line
    for line: ``#pragma`` lines keep theirs. The Metal rendering stays as written."""
    text = "  int a = 1;  // one\n\n#pragma unroll\n  /* two\n  lines */ for (;;) {\n    a += 1;\n  }\n"
    assert render_cuda.compact(text) == "int a = 1;\n#pragma unroll\nfor (;;) {\na += 1;\n}\n"
    from kernelfleet.kernels.catalog import decode_attention
    from kernelfleet.kernels.render.launch import render as render_source

    cuda = render_source(decode_attention.source(0.125), "cuda")
    for text in (cuda.header, cuda.source):
        assert "//" not in text and "/*" not in text and "\n\n" not in text
        assert all(line == line.strip() for line in text.splitlines())
    assert cuda.header.endswith(cuda.own_header) and "#pragma unroll\n" in cuda.source
    assert "// " in render_source(decode_attention.source(0.125), "metal").source


def test_cuda_sources_hold_only_the_helpers_they_use() -> None:
    """A CUDA kernel's header holds the prelude's blocks its body and own header name, with the blocks
    those name (kf_vload_h: kf_word, kf_vload, kf_vec), in the prelude's order, and nothing else; a Metal
    kernel's the whole prelude. Whether each pruned source compiles is test_cuda_render's and
    test_cuda_precompile's."""
    full = dialect.prelude("cuda")
    got = dialect.prelude_for("cuda", "kf_vec<float, 4> v = kf_vload_h<4, 1>(p, i); kf_warp_sum(x);")
    for name in ("kf_vec", "kf_vload(", "kf_word", "kf_vload_h", "kf_warp_sum"):
        assert name in got, name
    for name in ("kf_vstore", "kf_row_sum", "kf_code", "kf_and_or", "kf_shfl_xor", "kf_warp_max"):
        assert name not in got, name
    lines = iter(full.splitlines())
    assert all(line in lines for line in got.splitlines())  # the prelude's lines, in its order
    assert dialect.prelude_for("cuda", "int a = 0;") == ""
    from kernelfleet.kernels.catalog.quantized_matmul_kernel import qmv_source
    from kernelfleet.kernels.render.launch import render as render_source

    cuda, metal = (render_source(qmv_source("residual"), backend) for backend in ("cuda", "metal"))
    assert "kf_code" in cuda.header and "kf_row_max" not in cuda.header and len(cuda.header) < len(full)
    assert metal.header.startswith(dialect.prelude("metal"))
