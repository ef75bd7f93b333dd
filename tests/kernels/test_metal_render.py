"""Metal checked off-Mac with the strict MSL compile model (kernels/testing/msl.h, clang): every
kernel the catalog launches at its test, decode and large shapes (each kernel x dtype x config), in
the exact text MLX compiles, has no error (a rotating third of them a day, tests/sampling.py; all
under make test-full); and each of five errors a permissive stub let through,
planted into a real kernel, fails the check."""

from __future__ import annotations

import mlx.core as mx
import pytest
from sampling import covered, rotating

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.testing import compile_strict, metal_kernel
from kernelfleet.kernels.testing.mlx_metal import MetalKernel
from kernelfleet.kernels.testing.msl_clang import RewriteError, clang_path, for_clang

from .capture import metal_kernels, records

pytestmark = pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (apt-get install clang)")


@pytest.mark.slow
def test_every_catalog_kernel_passes_the_strict_model() -> None:
    every = metal_kernels(("test", "decode", "large"))
    assert len(every) > 4000
    # a sixth a day (rotating: six days compile every one; make test-full compiles all at once)
    kernels = rotating(every, -(-len(every) // 6), "strict-msl")
    report = compile_strict(kernels)
    print(f"strict MSL model: {report.summary()}\n" + covered("kernels compiled", len(kernels), len(every)))
    assert report.kernels == len(kernels)
    assert report.ok, report.summary()
    for k in kernels:  # MLX adds attribute parameters only for Metal's names: never CUDA's
        assert "threadIdx" not in k.text and "__syncthreads" not in k.text


def _rmsnorm(dtype: str, plant: tuple[str, str] | None) -> MetalKernel:
    """The first rmsnorm config at its test shape, with ``old`` replaced by ``new`` in the body."""
    rec, _ = records(get_spec("rmsnorm"), "metal", dtype)[0]
    r = rec.rendered
    body = r.source
    if plant is not None:
        assert plant[0] in body, plant[0]
        body = body.replace(plant[0], plant[1], 1)
    return metal_kernel(r.name + ("_planted" if plant else ""), r.inputs, r.outputs, body, r.header,
                        rec.input_dtypes, rec.input_shapes, rec.output_dtypes, rec.launch.template)


INV, SS = "const float inv = ", "float ss = 0.0f;"
PLANTED = {  # error: (dtype, (text of rmsnorm's body, what replaces it))
    "implicit float to bfloat store": ("bfloat16", ("o.v[k] = T(", "o.v[k] = (")),
    "metal::precise::exp(half)": ("float16", (INV, INV + "metal::precise::exp(half(ss)) * ")),
    "threadgroup pointer to a device helper": ("float32", (SS, SS + " auto bad = kf_vload<1>(red, 0);")),
    "simd_sum(size_t)": ("float32", (SS, SS + " size_t bad = simd_sum(row);")),
    "erff and fmaxf": ("float32", (INV, "ss = erff(ss) + fmaxf(ss, 0.0f); " + INV)),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_unplanted_kernel_passes(dtype: str) -> None:
    report = compile_strict([_rmsnorm(dtype, None)])
    assert report.ok, report.summary()


@pytest.mark.parametrize("error", sorted(PLANTED))
def test_planted_error_fails_the_strict_model(error: str) -> None:
    dtype, plant = PLANTED[error]
    kernel = _rmsnorm(dtype, plant)
    report = compile_strict([kernel])
    assert not report.ok, f"{error} was accepted"
    print(f"{error}: {report.errors[kernel.name][0]}")


def test_threadgroup_variables_follow_msl_rules() -> None:
    """The one rewrite of kernel text (a threadgroup variable becomes a reference to group memory)
    keeps line numbers and refuses what MSL refuses."""
    body = "void k() {\n  threadgroup float red[32];\n  float a = 0.0f;\n  threadgroup int n;\n  red[0] = a;}"
    out = for_clang(body)
    assert out.count("\n") == body.count("\n")
    assert "threadgroup float (&red)[(32)] = kf_threadgroup_memory<float[(32)]>();" in out
    assert "threadgroup int (&n) = kf_threadgroup_memory<int>();" in out
    # a size with a comparison in it stays one template argument (it read `float[KS >` before)
    sized = for_clang("template <int KS> void k() {\n  threadgroup float part[KS > 1 ? 4 * KS : 1];\n}")
    assert "kf_threadgroup_memory<float[(KS>1?4*KS:1)]>()" in sized
    assert for_clang("inline void f(threadgroup float* buf) { buf[0] = 1.0f; }", kernel=False)
    for bad, kernel in [("void k() { threadgroup float s = 0.0f; }", True),  # no initializers
                        ("inline void f() { threadgroup float s[4]; }", False),  # kernel functions only
                        ("void k() { threadgroup float a[4], b[4]; }", True)]:
        with pytest.raises(RewriteError):
            for_clang(bad, kernel=kernel)


# A conditional between operands of one scalar type is valid MSL whatever their address spaces and
# value categories. bfloat is a class in the model, where clang keeps the address space (a private
# lvalue and a prvalue were "incompatible operand types"); half and float are built-in types.
SIGMOID = ("template <typename T> T kf_sig(T x) {\n  T y = T(1) / (T(1) + metal::exp(-x));\n"
           "  return /* σ(x) */ (x < T(0)) ? y : T(1) - y;\n}\n")  # zmlx's kk_sigmoid (σ: clang counts bytes)
CONDITIONALS = {  # name: body lines (x: device input, k: constant input, out: device output)
    "private_lvalue_prvalue": "T y = x[i];\n  out[i] = (x[i] < T(0)) ? y : T(1) - y;",
    "prvalue_private_lvalue": "T y = x[i];\n  out[i] = (i % 2 == 0) ? T(1) : y;",
    "device_lvalue_prvalue": "out[i] = (x[i] < T(0)) ? x[i] : T(0);",
    "constant_threadgroup_lvalues": ("threadgroup T t[4];\n  t[i % 4] = x[i];\n"
                                     "  out[i] = (i < 2) ? k[i] : t[i % 4];"),
    "nested": "T y = x[i];\n  out[i] = (i < 2) ? ((y < T(0)) ? y : T(0)) : x[i];",
    "header_helper": "out[i] = kf_sig(x[i]);",
    "to_float": "T y = x[i];\n  float f = (y < T(0)) ? y : T(1);\n  out[i] = T(f);",
}
# ... and what MSL refuses of a bfloat conditional, the model still refuses
BFLOAT_CONDITIONALS_REFUSED = {
    "bfloat_to_half_implicitly": "T y = x[i];\n  half h = (y < T(0)) ? y : T(1);\n  out[i] = T(h);",
    "float_operand_stored_as_bfloat": "T y = x[i];\n  out[i] = (y < T(0)) ? y : 1.0f;",
    "float_to_bfloat_return": "T y = x[i];\n  bfloat z = (y < T(0)) ? float(y) : T(1) - y;\n  out[i] = z;",
}


def _conditional(name: str, body: str, dtype: mx.Dtype) -> MetalKernel:
    return metal_kernel(name, ["x", "k"], ["out"], f"uint i = thread_position_in_grid.x;\n  {body}", SIGMOID,
                        [dtype, dtype], [(64,), (2,)], [dtype], [("T", dtype)])


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_conditionals_of_one_scalar_type_pass_whatever_their_address_spaces(dtype: mx.Dtype) -> None:
    kernels = [_conditional(name, body, dtype) for name, body in CONDITIONALS.items()]
    assert all(k.text.count(" ? ") >= 1 for k in kernels)
    report = compile_strict(kernels)
    assert report.kernels == len(CONDITIONALS)
    assert report.ok, report.summary()


def test_what_msl_refuses_of_a_bfloat_conditional_still_fails() -> None:
    kernels = [_conditional(name, body, mx.bfloat16) for name, body in BFLOAT_CONDITIONALS_REFUSED.items()]
    report = compile_strict(kernels)
    assert sorted(report.errors) == sorted(k.name for k in kernels), report.summary()
    for k in kernels:
        print(f"{k.name}: {report.errors[k.name][0]}")
        assert not any("incompatible operand types" in e for e in report.errors[k.name])
