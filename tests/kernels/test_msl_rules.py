"""The strict MSL model refuses what Metal refuses and accepts what it accepts: one small kernel per
construct (a negative and a positive test each), the evidence for each rule in its test's docstring.

Sections are the Metal Shading Language Specification's (version 3.x; the numbering is stable since
2.x) and the Metal feature set tables' rows."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.kernels.testing import compile_strict, metal_kernel
from kernelfleet.kernels.testing.mlx_metal import MetalKernel
from kernelfleet.kernels.testing.msl_clang import clang_path, vector_constructors
from kernelfleet.kernels.testing.msl_rules import MAX_BUFFERS, text_errors

pytestmark = pytest.mark.skipif(clang_path() is None, reason="no clang++ on PATH (apt-get install clang)")

F32 = mx.float32


def _kernel(name: str, body: str, header: str = "", inputs: int = 1) -> MetalKernel:
    """x (device float, 64 elements; more inputs x1.. if asked) -> out (device float)."""
    names = ["x"] + [f"x{j}" for j in range(1, inputs)]
    return metal_kernel(name, names, ["out"], f"uint i = thread_position_in_grid.x;\n  {body}", header,
                        [F32] * inputs, [(64,)] * inputs, [F32])


def _refused(kernel: MetalKernel, expect: str) -> str:
    report = compile_strict([kernel])
    assert kernel.name in report.errors, f"{kernel.name} was accepted"
    first = " | ".join(report.errors[kernel.name])
    assert expect in first, first
    print(f"{kernel.name}: {first[:200]}")
    return first


def _accepted(*kernels: MetalKernel) -> None:
    report = compile_strict(list(kernels))
    assert report.kernels == len(kernels)
    assert report.ok, report.summary()


def test_double_is_refused() -> None:
    """MSL spec 2.1 Scalar Data Types: "Metal does not support the double, long long, unsigned long
    long, and long double data types." (the model: clang without cl_khr_fp64 / __opencl_c_fp64)"""
    _refused(_kernel("dbl", "double d = double(x[i]);\n  out[i] = float(d);"), "double")
    _accepted(_kernel("no_dbl", "float d = float(x[i]) * 2.0;\n  out[i] = d;"))  # a 2.0 literal is a float


def test_long_long_is_refused() -> None:
    """MSL spec 2.1 Scalar Data Types (as above): no long long; 64-bit integers are long/ulong."""
    _refused(_kernel("ll", "long long n = i;\n  out[i] = x[i] + float(n);"), "long long")
    _accepted(_kernel("lng", "long n = i;\n  out[i] = x[i] + float(n);"))


def test_goto_is_refused() -> None:
    """MSL spec 1.4 Metal and C++ (restrictions): the goto statement is not supported."""
    _refused(_kernel("gt", "if (i >= 64) goto done;\n  out[i] = x[i];\n  done: ;"), "goto")
    _accepted(_kernel("no_gt", "if (i >= 64) return;\n  out[i] = x[i];  // goto: a comment is no statement"))


def test_mutable_program_scope_variable_is_refused() -> None:
    """MSL spec 4.2 constant Address Space: variables in program scope must be declared in the
    constant address space (the model: clang without __opencl_c_program_scope_global_variables)."""
    _refused(_kernel("glob", "out[i] = x[i] * kf_scale;", "float kf_scale = 2.0f;\n"),
             "program scope variable must reside in constant address space")
    _accepted(_kernel("const_glob", "out[i] = x[i] * kf_scale;", "constant float kf_scale = 2.0f;\n"))


def test_pointer_parameter_without_address_space_is_refused() -> None:
    """MSL spec 4 Address Spaces: a pointer or reference argument must name its address space
    (device, constant, threadgroup or thread); C++ for OpenCL's unnamed default is not MSL."""
    header = "inline float kf_first(float* p) { return p[0]; }\n"
    _refused(_kernel("ptr_param", "float t[2] = {x[i], 0.0f};\n  out[i] = kf_first(t);", header),
             "pointer parameter `float* p` of kf_first has no address space")
    ok = "inline float kf_first(thread float* p) { return p[0]; }\n"
    _accepted(_kernel("thread_ptr_param", "float t[2] = {x[i], 0.0f};\n  out[i] = kf_first(t);", ok))


def test_device_and_threadgroup_pointers_to_an_unnamed_parameter_are_refused() -> None:
    """MSL spec 4 Address Spaces: device and threadgroup pointers never convert to another address
    space; Metal before 4.1 has no generic address space (C++ for OpenCL 2021's generic one would
    take both), so a helper parameter must name one."""
    header = "inline float kf_get(const float* p, uint j) { return p[j]; }\n"
    body = ("threadgroup float t[32];\n  t[i % 32] = x[i];\n"
            "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "  out[i] = kf_get(x, i) + kf_get(t, 0);")
    _refused(_kernel("ptr_dev_tg", body, header), "no address space")
    assert "kf_get" in text_errors(header)[0]
    ok = ("inline float kf_get(const device float* p, uint j) { return p[j]; }\n"
          "inline float kf_get(const threadgroup float* p, uint j) { return p[j]; }\n")
    _accepted(_kernel("ptr_dev_tg_named", body, ok))


def test_local_pointer_without_address_space_is_refused() -> None:
    """MSL spec 4 Address Spaces (as above), for a local pointer variable."""
    _refused(_kernel("ptr_local", "const float* p = x;\n  out[i] = p[i] * 2.0f;"), "local pointer `p`")
    _accepted(_kernel("ptr_local_named", "const device float* p = x;\n  out[i] = p[i] * 2.0f;"))


def test_more_than_31_buffers_is_refused() -> None:
    """Metal feature set tables: 31 entries in a kernel function's buffer argument table (MSL spec
    5.2.1: [[buffer(index)]])."""
    body = "out[i] = x[i] + x31[i];"
    _refused(_kernel("bufs32", body, inputs=MAX_BUFFERS + 1), "33 buffer arguments")
    _accepted(_kernel("bufs31", "out[i] = x[i] + x29[i];", inputs=MAX_BUFFERS - 1))  # 30 inputs + out


def test_threadgroup_memory_over_32_kb_is_refused() -> None:
    """Metal feature set tables: maximum total threadgroup memory allocation 32 KB (MTLDevice's
    maxThreadgroupMemoryLength, 32768 on Apple silicon); counted over a kernel's variables."""
    body = ("threadgroup float t[{n}];\n  threadgroup float u[{m}];\n  t[i] = x[i];\n  u[i] = x[i];\n"
            "  out[i] = t[i] + u[i];")
    _refused(_kernel("tg36k", body.format(n=8192, m=1024)), "over 32 KB")
    _accepted(_kernel("tg32k", body.format(n=7168, m=1024)))


def test_atomic_fetch_add_on_atomic_uint_is_accepted() -> None:
    """MSL spec 6.15 Atomic Functions: atomic_fetch_add_explicit on atomic_uint (device or
    threadgroup), memory_order_relaxed."""
    _accepted(_kernel("atomic_tg", "threadgroup atomic_uint n;\n  if (i == 0) atomic_store_explicit(&n, 0u, "
                      "memory_order_relaxed);\n  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
                      "  uint k = atomic_fetch_add_explicit(&n, 1u, memory_order_relaxed);\n"
                      "  out[i] = x[i] + float(k);"))
    _refused(_kernel("atomic_on_uint", "threadgroup uint n;\n  n = 0u;\n"
                     "  atomic_fetch_add_explicit(&n, 1u, memory_order_relaxed);\n  out[i] = x[i];"),
             "no matching function for call to 'atomic_fetch_add_explicit'")


def test_simd_shuffle_of_64_bit_values_is_accepted() -> None:
    """MSL spec 6.9.2 SIMD-Group Functions: simd_shuffle and simd_broadcast take any scalar or vector
    type, 64-bit long and ulong included (the reductions simd_sum ... do not take 64-bit values)."""
    _accepted(_kernel("shfl64", "ulong v = ulong(i) << 33;\n  long w = long(i);\n"
                      "  ulong a = simd_shuffle(v, ushort(0));\n  long b = simd_shuffle_xor(w, ushort(1));\n"
                      "  out[i] = x[i] + float(a >> 33) + float(b);"))
    _refused(_kernel("sum64", "ulong v = ulong(i);\n  out[i] = x[i] + float(simd_sum(v));"),
             "no matching function for call to 'simd_sum'")


# MSL's vector constructors: msl_clang.py rewrites `T<n>(...)` into msl.h's kf_make_vector (clang's
# ext_vector_type has none of them; bfloat vectors, and half vectors in the emulator, are classes)

def test_vector_constructor_from_scalars_and_vectors_is_accepted() -> None:
    """MSL spec 2.2 Vector Data Types (vector constructors): a vector Tn is constructed from scalars and
    vectors of its element type whose components add up to n, in order -- float4(float x, float y,
    float z, float w), float4(float2 a, float b, float c), float4(float a, float3 b) ... -- or from one
    scalar, replicated in every component (float4(float x))."""
    _accepted(_kernel("vec_scalars", "float4 f = float4(x[i], 1.0f, 2.0f, 3.0f);\n  out[i] = f.x + f.w;"),
              _kernel("vec_mixed", "float2 a = float2(x[i], -x[i]);\n  float4 f = float4(a, 2.0f, 3.0f);\n"
                      "  float3 g = float3(1.0f, a);\n  float4 s = float4(x[i]);\n"
                      "  out[i] = f.y + f.z + g.z + s.w;"),
              _kernel("vec_int", "uint4 u = uint4(i, 1u, uint2(2u, 3u));\n  int2 n = int2(1);\n"
                      "  out[i] = x[i] + float(u.z) + float(n.y);"))


def test_vector_constructor_components_must_add_up() -> None:
    """MSL spec 2.2 (vector constructors, as above): only argument lists whose components add up to the
    vector's are constructors (or one scalar): float4(x, y) of two scalars is none; neither is a vector
    of other element type among several arguments (there is no implicit vector conversion, 2.12)."""
    _refused(_kernel("vec_two_of_four", "float4 f = float4(x[i], 1.0f);\n  out[i] = f.x;"),
             "components do not add up")
    _refused(_kernel("vec_three_in_four", "float3 a = float3(x[i]);\n  float4 f = float4(a);\n"
                     "  out[i] = f.x;"),
             "components do not add up")
    _refused(_kernel("vec_half_parts", "half2 h = half2(half(1.0f));\n  float4 f = float4(h, h);\n"
                     "  out[i] = f.x;"),
             "a vector argument of another element type")


def test_explicit_vector_conversion_is_accepted_and_implicit_refused() -> None:
    """MSL spec 2.12 Type Conversions and Re-interpreting Data: an explicit conversion between vector
    types of the same number of components converts each element (half4(float4), int4(float4),
    float4(uint4)); an implicit conversion between vector types is an error (Metal's compiler: "cannot
    convert between vector values of different size"; SPIRV-Cross casts explicitly for that reason).
    clang's ext_vector_type would bit-cast or refuse: the model converts element-wise, as Metal does."""
    _accepted(_kernel("vec_to_half", "float4 f = float4(x[i]);\n  half4 h = half4(f);\n"
                      "  int4 n = int4(f);\n  float4 g = float4(uint4(n));\n  out[i] = float(h.y) + g.x;"))
    _refused(_kernel("vec_implicit_half", "float4 f = float4(x[i]);\n  half4 h = f;\n  out[i] = float(h.x);"),
             "cannot initialize a variable of type")


def test_bfloat_vectors_convert_explicitly_from_and_to_float() -> None:
    """MSL spec 2.1 and 2.2 (MSL 3.1+): bfloat has vector types bfloat2, bfloat3, bfloat4; like bfloat
    itself (converted only explicitly from float), a bfloat vector is built from a float vector by an
    explicit conversion (bfloat4(float4)) and converts back explicitly (float4(bfloat4)); implicitly
    in neither direction, and a float scalar does not fill a bfloat vector unconverted."""
    _accepted(_kernel("bf_vec", "float4 f = float4(x[i], 1.0f, 2.0f, 3.0f);\n  bfloat4 b = bfloat4(f);\n"
                      "  bfloat4 c = b * b + b;\n  bfloat2 d = bfloat2(bfloat(2.0f));\n"
                      "  float4 g = float4(c);\n  out[i] = g.x + float(b.w) + float(d.y);"))
    _refused(_kernel("bf_vec_implicit", "float4 f = float4(x[i]);\n  bfloat4 b = f;\n  out[i] = float(b.x);"),
             "no viable conversion")
    _refused(_kernel("bf_vec_back", "bfloat4 b = bfloat4(float4(x[i]));\n  float4 f = b;\n  out[i] = f.x;"),
             "no viable conversion")
    _refused(_kernel("bf_vec_float_scalar", "bfloat4 b = bfloat4(x[i]);\n  out[i] = float(b.x);"),
             "no viable conversion")


def test_vector_constructor_rewrite_leaves_declarations_alone() -> None:
    """The rewrite (msl_clang.vector_constructors) turns calls, not declarations, members or another
    namespace's names, and keeps lines."""
    src = ("inline float4 kf_f(float4 v) {\n  return float4(v.xy, metal::float2(v.z, 1.0f));\n}\n"
           "operator float4(void) const;\nfloat4 z = float4();\n"
           "q.float4(v); ns::half2(v); p->int2(v); my_float4(v);\n"
           "vec<half, 4>(f);")
    out = vector_constructors(src)
    assert out.splitlines()[0] == "inline float4 kf_f(float4 v) {"
    assert "return kf_make_vector<float4>(v.xy, kf_make_vector<metal::float2>(v.z, 1.0f));" in out
    assert "operator float4(void) const;" in out and "float4 z = float4();" in out
    assert "q.float4(v); ns::half2(v); p->int2(v); my_float4(v);" in out
    assert "kf_make_vector<vec<half, 4>>(f);" in out
    assert out.count("\n") == src.count("\n")
