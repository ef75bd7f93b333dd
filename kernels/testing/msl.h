// A model of the Metal Shading Language (plus what MLX's metal::utils() adds) for clang, off a Mac.
//
// Two modes:
// - strict (default): declarations only, compiled with clang -fsyntax-only in its C++ for OpenCL
//   2021 mode (-x clcpp), for the only reason that there clang's address spaces behave as MSL's:
//   device, constant, threadgroup and thread are the distinct clang address spaces __global,
//   __constant, __local and __private; a pointer to one never converts to another, and a struct
//   (bfloat) still copies between them (plain C++ with __attribute__((address_space(N))) cannot
//   copy a struct into device memory). Nothing of OpenCL's library is included. It models what
//   MSL enforces and a permissive stub would let through:
//   * address spaces, as above;
//   * overload sets: simd_* take MSL scalar types only -- no 64-bit integers, so no size_t;
//     metal::max/min/clamp take one type for all arguments; metal::precise::* and metal::fast::*
//     take float (and MLX's bfloat overloads), never half;
//   * bfloat converts only explicitly from float/half/int, implicitly only to float;
//   * vectors convert only explicitly, element by element (half4(float4), bfloat4(float4)), and are
//     constructed from scalars and vectors whose components add up (msl_clang.py's rewrite into
//     kf_make_vector, at the end);
//   * bfloat is a class here but a scalar in MSL. Where that shows -- clang keeps the address space of
//     a class-type lvalue, so `c ? y : T(1) - y` (a __private bfloat lvalue, a bfloat prvalue) is
//     "incompatible operand types" -- msl_strict.py wraps both operands in kf_rvalue (below), the
//     conversion to a prvalue MSL applies to scalar operands (half and float are built-in
//     types: clang drops their address space with their other qualifiers, so they never hit it);
//   * no C library: no <cmath>, so erff/fmaxf/expf are undeclared, as on Metal.
// - emulate (KF_MSL_EMULATE): the same overload sets with definitions, compiled as plain C++ for
//   running kernels on the CPU (emu_runtime.h provides barriers, SIMD-group functions and
//   threadgroup memory). Address-space qualifiers are empty there; the strict mode checks them.
#pragma once

#if defined(KF_MSL_EMULATE)
#define device
#define constant
#define threadgroup
#define thread
#define KF_DECL inline
#define KF_BODY(...) { __VA_ARGS__ }
#else
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define device __global
#define constant __constant
#define threadgroup __local
#define thread __private
// OpenCL keywords that are ordinary names in MSL
#define kernel
#define global kf_msl_global
#define local kf_msl_local
#define generic kf_msl_generic
#define read_only kf_msl_read_only
#define write_only kf_msl_write_only
#define read_write kf_msl_read_write
#define pipe kf_msl_pipe
#define atomic_int kf_msl_atomic_int  // OpenCL's built-in atomic types: MSL's are atomic<T>
#define atomic_uint kf_msl_atomic_uint
#define KF_DECL
#define KF_BODY(...) ;
#endif

typedef __INT8_TYPE__ int8_t;
typedef __INT16_TYPE__ int16_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define MAXFLOAT (3.40282347e+38f)
#define FLT_MAX (3.40282347e+38f)
#define FLT_MIN (1.17549435e-38f)
#define M_PI_F (3.14159265358979323846264338327950288f)

namespace metal {

template <bool B, typename T = void> struct enable_if {};
template <typename T> struct enable_if<true, T> { typedef T type; };
template <bool B, typename T = void> using enable_if_t = typename enable_if<B, T>::type;
template <typename A, typename B> struct is_same { static constexpr constant bool value = false; };
template <typename A> struct is_same<A, A> { static constexpr constant bool value = true; };
template <typename A, typename B> constexpr constant bool is_same_v = is_same<A, B>::value;

// ---- half ------------------------------------------------------------------------------------
#if defined(KF_MSL_EMULATE)
// x86 clang has no _Float16 arithmetic: a 16-bit IEEE half that computes in float (the GPU computes
// in half; results are rounded to half wherever a half is stored, as there).
struct half {
  uint16_t bits;
  half() = default;
  half(float f) : bits(from_float(f)) {}
  half(double f) : bits(from_float(float(f))) {}
  half(int i) : bits(from_float(float(i))) {}
  half(uint i) : bits(from_float(float(i))) {}
  operator float() const { return to_float(bits); }
  template <typename U> half& operator+=(U o) { return *this = half(float(*this) + float(o)); }
  template <typename U> half& operator-=(U o) { return *this = half(float(*this) - float(o)); }
  template <typename U> half& operator*=(U o) { return *this = half(float(*this) * float(o)); }
  template <typename U> half& operator/=(U o) { return *this = half(float(*this) / float(o)); }
  // half op half is a half, as in MSL (`c ? y : T(1) - y` must not mix half and float); a half with
  // any other type goes through float (templates matching only half, so no overload is ambiguous)
#define KF_HALF_OP(op)                                                                         \
  template <typename A, typename B, typename = enable_if_t<is_same_v<A, half> && is_same_v<B, half>>> \
  friend half operator op(A a, B b) { return half(float(a) op float(b)); }
  KF_HALF_OP(+) KF_HALF_OP(-) KF_HALF_OP(*) KF_HALF_OP(/)
#undef KF_HALF_OP
  template <typename A, typename = enable_if_t<is_same_v<A, half>>>
  friend half operator-(A a) { return half(-float(a)); }
  static uint16_t from_float(float f) {
    uint32_t x = __builtin_bit_cast(uint32_t, f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
    if (ax < 0x38800000u) {  // subnormal half (or zero): round to nearest even at 2^-24
      float r = __builtin_bit_cast(float, ax) * 16777216.0f;  // exact scaling into [0, 1024)
      uint32_t m = uint32_t(__builtin_rintf(r));
      return uint16_t(sign | m);
    }
    uint32_t m = ax + 0xfffu + ((ax >> 13) & 1u);  // round to nearest even
    return uint16_t(sign | ((m - 0x38000000u) >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return __builtin_bit_cast(float, sign) + (sign ? -1.0f : 1.0f) * float(m) * 5.9604645e-8f;
    if (e == 31) return __builtin_bit_cast(float, sign | 0x7f800000u | (m << 13));
    return __builtin_bit_cast(float, sign | ((e + 112u) << 23) | (m << 13));
  }
};
#endif  // strict: `half` is clang's OpenCL half (cl_khr_fp16): arithmetic in half, as in MSL

// ---- bfloat: explicit-only conversions in, implicit only to float --------------------------------
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(const bfloat&) = default;
  bfloat& operator=(const bfloat&) = default;
  explicit bfloat(float f) : bits(round(f)) {}
#if defined(KF_MSL_EMULATE)  // MSL has no double (strict mode: clang refuses it)
  explicit bfloat(double f) : bits(round(float(f))) {}
#endif
  explicit bfloat(int i) : bits(round(float(i))) {}
  explicit bfloat(uint i) : bits(round(float(i))) {}
  explicit bfloat(half h) : bits(round(float(h))) {}
  // to float (implicit); to anything else only explicitly
  template <typename U, typename = enable_if_t<is_same_v<U, float>>>
  operator U() const { return __builtin_bit_cast(float, uint32_t(bits) << 16); }
  explicit operator half() const { return half(float(*this)); }
  explicit operator int() const { return int(float(*this)); }
  explicit operator uint() const { return uint(float(*this)); }
#if !defined(KF_MSL_EMULATE)
  // __constant does not convert to OpenCL's generic space: the same members for constant objects
  bfloat(const __constant bfloat& o) : bits(o.bits) {}
  template <typename U, typename = enable_if_t<is_same_v<U, float>>> operator U() const __constant;
  explicit operator half() const __constant;
  explicit operator int() const __constant;
  explicit operator uint() const __constant;
#endif
  static uint16_t round(float f) {
    uint32_t x = __builtin_bit_cast(uint32_t, f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // round to nearest even
  }
  friend bfloat operator+(bfloat a, bfloat b) { return bfloat(float(a) + float(b)); }
  friend bfloat operator-(bfloat a, bfloat b) { return bfloat(float(a) - float(b)); }
  friend bfloat operator*(bfloat a, bfloat b) { return bfloat(float(a) * float(b)); }
  friend bfloat operator/(bfloat a, bfloat b) { return bfloat(float(a) / float(b)); }
  friend bfloat operator-(bfloat a) { return bfloat(-float(a)); }
  bfloat& operator+=(bfloat o) { return *this = *this + o; }
  bfloat& operator-=(bfloat o) { return *this = *this - o; }
  bfloat& operator*=(bfloat o) { return *this = *this * o; }
  bfloat& operator/=(bfloat o) { return *this = *this / o; }
  friend bool operator<(bfloat a, bfloat b) { return float(a) < float(b); }
  friend bool operator>(bfloat a, bfloat b) { return float(a) > float(b); }
  friend bool operator<=(bfloat a, bfloat b) { return float(a) <= float(b); }
  friend bool operator>=(bfloat a, bfloat b) { return float(a) >= float(b); }
  friend bool operator==(bfloat a, bfloat b) { return float(a) == float(b); }
  friend bool operator!=(bfloat a, bfloat b) { return float(a) != float(b); }
};

template <typename T> struct is_msl_scalar { static constexpr constant bool value = false; };
#define KF_MSL_SCALAR(T) template <> struct is_msl_scalar<T> { static constexpr constant bool value = true; };
KF_MSL_SCALAR(bool) KF_MSL_SCALAR(char) KF_MSL_SCALAR(signed char) KF_MSL_SCALAR(uchar)
KF_MSL_SCALAR(short) KF_MSL_SCALAR(ushort) KF_MSL_SCALAR(int) KF_MSL_SCALAR(uint)
KF_MSL_SCALAR(half) KF_MSL_SCALAR(float) KF_MSL_SCALAR(bfloat)
#undef KF_MSL_SCALAR

// ---- vectors (MSL spec 2.2). Of built-in element types: ext_vector_type (swizzles, element-wise
// operators, no implicit element conversion). Of class element types -- bfloat, and half under
// KF_MSL_EMULATE, where half is a class -- kf_svec below: .x .y .z .w, [], element-wise + - * /,
// a scalar of the element type splatted, and no conversion from any other vector.
template <typename T, int N> struct kf_svec_data;
template <typename T> struct kf_svec_data<T, 2> { T x, y; };
template <typename T> struct kf_svec_data<T, 3> { T x, y, z; };
template <typename T> struct kf_svec_data<T, 4> { T x, y, z, w; };
// MSL's size and alignment: a 3-vector is a 4-vector's size (MSL spec 2.2, vector types' alignment)
template <typename T, int N> struct alignas(sizeof(T) * (N == 3 ? 4 : N)) kf_svec : kf_svec_data<T, N> {
  kf_svec() = default;
  // a scalar converts implicitly to a vector, replicated (MSL spec 2.12): a scalar that converts
  // implicitly to the element type (so not a float to a bfloat vector)
  template <typename U, typename = enable_if_t<is_same_v<U, T> || (!is_same_v<T, bfloat> && __is_arithmetic(U))>>
  kf_svec(U s) { for (int k = 0; k < N; ++k) (*this)[k] = T(s); }
  T& operator[](int k) { return (&this->x)[k]; }
  T operator[](int k) const { return (&this->x)[k]; }
#define KF_SVEC_OP(op)                                                                  \
  friend kf_svec operator op(kf_svec a, kf_svec b) {                                    \
    for (int k = 0; k < N; ++k) a[k] = T(a[k] op b[k]);                                 \
    return a;                                                                           \
  }                                                                                     \
  kf_svec& operator op##=(kf_svec b) { return *this = *this op b; }
  KF_SVEC_OP(+) KF_SVEC_OP(-) KF_SVEC_OP(*) KF_SVEC_OP(/)
#undef KF_SVEC_OP
  friend kf_svec operator-(kf_svec a) {
    for (int k = 0; k < N; ++k) a[k] = T(-a[k]);
    return a;
  }
};

template <typename T, int N> struct vec_of { typedef T type __attribute__((ext_vector_type(N))); };
template <int N> struct vec_of<bfloat, N> { typedef kf_svec<bfloat, N> type; };
#if defined(KF_MSL_EMULATE)
template <int N> struct vec_of<half, N> { typedef kf_svec<half, N> type; };
#endif
template <typename T, int N> using vec = typename vec_of<T, N>::type;
// what kf_make_vector needs of a type: its element type and component count (0: not a vector)
template <typename V> struct kf_vector_info { static constexpr constant int n = 0; typedef V elem; };
#define KF_VECTOR_INFO(T, N) \
  template <> struct kf_vector_info<vec<T, N>> { static constexpr constant int n = N; typedef T elem; };
#define KF_VEC_TYPES(T)                                                                          \
  typedef vec<T, 2> T##2;                                                                        \
  typedef vec<T, 3> T##3;                                                                        \
  typedef vec<T, 4> T##4;                                                                        \
  KF_VECTOR_INFO(T, 2) KF_VECTOR_INFO(T, 3) KF_VECTOR_INFO(T, 4)
KF_VEC_TYPES(float) KF_VEC_TYPES(half) KF_VEC_TYPES(bfloat) KF_VEC_TYPES(int) KF_VEC_TYPES(uint)
KF_VEC_TYPES(short) KF_VEC_TYPES(ushort) KF_VEC_TYPES(char) KF_VEC_TYPES(uchar)
#undef KF_VEC_TYPES
#undef KF_VECTOR_INFO

template <typename To, typename From> KF_DECL To as_type(From x) KF_BODY(
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  return __builtin_bit_cast(To, x);)

// ---- synchronisation -------------------------------------------------------------------------
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4,
                       mem_threadgroup_imageblock = 8, mem_object_data = 16 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

#if defined(KF_MSL_EMULATE)
}  // namespace metal
namespace kf_emu {
void barrier(int line);
template <typename T> T simd_op(int op, T value, uint arg, int line);
}  // namespace kf_emu
namespace metal {
#define KF_SITE int kf_line = __builtin_LINE()
#define KF_SIMD(op, v, arg) { return kf_emu::simd_op(op, v, arg, kf_line); }
inline void threadgroup_barrier(mem_flags, KF_SITE) { kf_emu::barrier(kf_line); }
inline void simdgroup_barrier(mem_flags, KF_SITE) { kf_emu::simd_op(0, 0, 0, kf_line); }
#else
#define KF_SITE int kf_line = 0
#define KF_SIMD(op, v, arg) ;
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);
#endif

// SIMD-group functions: templates constrained to MSL scalar types, so size_t, long or double do not
// match (a template never converts its argument).
enum { kf_simd_barrier, kf_simd_sum, kf_simd_product, kf_simd_max, kf_simd_min, kf_simd_and, kf_simd_or,
       kf_simd_xor, kf_simd_prefix_inclusive_sum, kf_simd_prefix_exclusive_sum, kf_simd_shuffle,
       kf_simd_shuffle_xor, kf_simd_shuffle_up, kf_simd_shuffle_down, kf_simd_broadcast,
       kf_simd_all, kf_simd_any };
#define KF_SIMD_REDUCE(name)                                                                    \
  template <typename T, typename = enable_if_t<is_msl_scalar<T>::value && !is_same_v<T, bool>>> \
  KF_DECL T name(T v, KF_SITE) KF_SIMD(kf_##name, v, 0)
// shuffles and broadcast move 64-bit values too (long, ulong); the reductions do not
template <typename T> struct is_msl_shuffled {
  static constexpr constant bool value = is_msl_scalar<T>::value || is_same_v<T, long> || is_same_v<T, ulong>;
};
#define KF_SIMD_SHUFFLE(name)                                                \
  template <typename T, typename = enable_if_t<is_msl_shuffled<T>::value>>   \
  KF_DECL T name(T v, ushort a, KF_SITE) KF_SIMD(kf_##name, v, a)
KF_SIMD_REDUCE(simd_sum) KF_SIMD_REDUCE(simd_product) KF_SIMD_REDUCE(simd_max) KF_SIMD_REDUCE(simd_min)
KF_SIMD_REDUCE(simd_and) KF_SIMD_REDUCE(simd_or) KF_SIMD_REDUCE(simd_xor)
KF_SIMD_REDUCE(simd_prefix_inclusive_sum) KF_SIMD_REDUCE(simd_prefix_exclusive_sum)
KF_SIMD_SHUFFLE(simd_shuffle) KF_SIMD_SHUFFLE(simd_shuffle_xor) KF_SIMD_SHUFFLE(simd_shuffle_up)
KF_SIMD_SHUFFLE(simd_shuffle_down) KF_SIMD_SHUFFLE(simd_broadcast)
#undef KF_SIMD_REDUCE
#undef KF_SIMD_SHUFFLE
KF_DECL bool simd_all(bool v, KF_SITE) KF_SIMD(kf_simd_all, v, 0)
KF_DECL bool simd_any(bool v, KF_SITE) KF_SIMD(kf_simd_any, v, 0)

// ---- atomics (MSL spec 6.15): atomic_int / atomic_uint in device or threadgroup memory, relaxed
// order. The emulator runs one thread at a time between rendezvous, so a plain read-modify-write is
// atomic there.
enum memory_order { memory_order_relaxed, memory_order_seq_cst };
template <typename T> struct atomic { T kf_value; };
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
#define KF_ATOMIC_INT template <typename T, typename = enable_if_t<is_same_v<T, int> || is_same_v<T, uint>>>
#define KF_ATOMICS(AS)                                                                                  \
  KF_ATOMIC_INT KF_DECL void atomic_store_explicit(volatile AS atomic<T>* o, T v, memory_order)         \
      KF_BODY(o->kf_value = v;)                                                                          \
  KF_ATOMIC_INT KF_DECL T atomic_load_explicit(volatile AS atomic<T>* o, memory_order)                  \
      KF_BODY(return o->kf_value;)                                                                       \
  KF_ATOMIC_INT KF_DECL T atomic_exchange_explicit(volatile AS atomic<T>* o, T v, memory_order)         \
      KF_BODY(T old = o->kf_value; o->kf_value = v; return old;)                                         \
  KF_ATOMIC_INT KF_DECL T atomic_fetch_add_explicit(volatile AS atomic<T>* o, T v, memory_order)        \
      KF_BODY(T old = o->kf_value; o->kf_value = T(old + v); return old;)                                \
  KF_ATOMIC_INT KF_DECL T atomic_fetch_sub_explicit(volatile AS atomic<T>* o, T v, memory_order)        \
      KF_BODY(T old = o->kf_value; o->kf_value = T(old - v); return old;)                                \
  KF_ATOMIC_INT KF_DECL T atomic_fetch_max_explicit(volatile AS atomic<T>* o, T v, memory_order)        \
      KF_BODY(T old = o->kf_value; o->kf_value = old > v ? old : v; return old;)                         \
  KF_ATOMIC_INT KF_DECL T atomic_fetch_min_explicit(volatile AS atomic<T>* o, T v, memory_order)        \
      KF_BODY(T old = o->kf_value; o->kf_value = old < v ? old : v; return old;)
#if defined(KF_MSL_EMULATE)
KF_ATOMICS()
#else
KF_ATOMICS(device) KF_ATOMICS(threadgroup)
#endif
#undef KF_ATOMICS
#undef KF_ATOMIC_INT

// ---- math ------------------------------------------------------------------------------------
// metal::F: half and float (bfloat through MLX's overloads); metal::precise::F and
// metal::fast::F: float only (bfloat through MLX). A deleted catch-all template takes every other
// argument type (half for precise/fast, int, double, size_t ...), so nothing converts silently.
#define KF_F1(F, impl) KF_DECL float F(float x) KF_BODY(return impl(x);)
#define KF_B1(F) KF_DECL bfloat F(bfloat x) KF_BODY(return bfloat(F(float(x)));)
#define KF_H1(F) KF_DECL half F(half x) KF_BODY(return half(F(float(x)));)
#define KF_F2(F, impl) KF_DECL float F(float x, float y) KF_BODY(return impl(x, y);)
#define KF_B2(F) KF_DECL bfloat F(bfloat x, bfloat y) KF_BODY(return bfloat(F(float(x), float(y)));)
#define KF_H2(F) KF_DECL half F(half x, half y) KF_BODY(return half(F(float(x), float(y)));)
#define KF_UNARY_FLOAT(F, impl) template <typename T> T F(T) = delete; KF_F1(F, impl) KF_B1(F)
#define KF_UNARY(F, impl) KF_UNARY_FLOAT(F, impl) KF_H1(F)
#define KF_BINARY_FLOAT(F, impl) template <typename T, typename U> T F(T, U) = delete; KF_F2(F, impl) KF_B2(F)
#define KF_BINARY(F, impl) KF_BINARY_FLOAT(F, impl) KF_H2(F)
#define KF_MATH_SET(UNARY, BINARY)                                                               \
  UNARY(exp, __builtin_expf) UNARY(exp2, __builtin_exp2f) UNARY(log, __builtin_logf)             \
  UNARY(log2, __builtin_log2f) UNARY(sqrt, __builtin_sqrtf) UNARY(rsqrt, 1.0f / __builtin_sqrtf) \
  UNARY(sin, __builtin_sinf) UNARY(cos, __builtin_cosf) UNARY(tan, __builtin_tanf)               \
  UNARY(tanh, __builtin_tanhf) UNARY(sinh, __builtin_sinhf) UNARY(cosh, __builtin_coshf)         \
  UNARY(fabs, __builtin_fabsf) UNARY(floor, __builtin_floorf) UNARY(ceil, __builtin_ceilf)       \
  UNARY(round, __builtin_roundf) UNARY(trunc, __builtin_truncf) UNARY(rint, __builtin_rintf)     \
  UNARY(log10, __builtin_log10f) UNARY(exp10, kf_exp10)                                         \
  BINARY(pow, __builtin_powf) BINARY(powr, __builtin_powf) BINARY(fmax, kf_fmax)                \
  BINARY(fmin, kf_fmin) BINARY(fmod, __builtin_fmodf) BINARY(atan2, __builtin_atan2f)

#if defined(KF_MSL_EMULATE)
inline float kf_exp10(float x) { return __builtin_powf(10.0f, x); }
inline float kf_fmax(float x, float y) { return x != x ? y : (y != y ? x : (x > y ? x : y)); }
inline float kf_fmin(float x, float y) { return x != x ? y : (y != y ? x : (x < y ? x : y)); }
#endif

KF_MATH_SET(KF_UNARY, KF_BINARY)
namespace precise { KF_MATH_SET(KF_UNARY_FLOAT, KF_BINARY_FLOAT) }
namespace fast { KF_MATH_SET(KF_UNARY_FLOAT, KF_BINARY_FLOAT) }

// abs, max, min, clamp, select, fma: templates, so every argument must have the same MSL scalar
// type (max(half, float) or max(float, 0) do not compile, as on Metal).
#if defined(KF_MSL_EMULATE)
// max/min with a NaN argument are undefined on Metal (fmax returns the other argument); the
// emulator propagates NaN, so a read of unwritten (NaN-filled) memory cannot hide behind a max.
template <typename T> inline T kf_max(T x, T y) { return x != x ? x : (y != y ? y : (x > y ? x : y)); }
template <typename T> inline T kf_min(T x, T y) { return x != x ? x : (y != y ? y : (x < y ? x : y)); }
#endif
#define KF_SAME_SCALAR template <typename T, typename = enable_if_t<is_msl_scalar<T>::value>>
KF_SAME_SCALAR KF_DECL T abs(T x) KF_BODY(return x < T(0) ? T(-x) : x;)
KF_SAME_SCALAR KF_DECL T max(T x, T y) KF_BODY(return kf_max(x, y);)
KF_SAME_SCALAR KF_DECL T min(T x, T y) KF_BODY(return kf_min(x, y);)
KF_SAME_SCALAR KF_DECL T clamp(T x, T lo, T hi) KF_BODY(return kf_min(kf_max(x, lo), hi);)
KF_SAME_SCALAR KF_DECL T select(T a, T b, bool c) KF_BODY(return c ? b : a;)
KF_SAME_SCALAR KF_DECL T fma(T a, T b, T c) KF_BODY(return T(__builtin_fmaf(float(a), float(b), float(c)));)
#undef KF_SAME_SCALAR
template <typename T> KF_DECL bool isnan(T x) KF_BODY(return float(x) != float(x);)
template <typename T> KF_DECL bool isinf(T x) KF_BODY(return __builtin_isinf(float(x));)
template <typename T> KF_DECL bool isfinite(T x) KF_BODY(return __builtin_isfinite(float(x));)

#undef KF_F1
#undef KF_B1
#undef KF_H1
#undef KF_F2
#undef KF_B2
#undef KF_H2
#undef KF_UNARY_FLOAT
#undef KF_UNARY
#undef KF_BINARY_FLOAT
#undef KF_BINARY
#undef KF_MATH_SET
#undef KF_SIMD
#undef KF_SITE

template <typename T> struct numeric_limits;
template <> struct numeric_limits<float> {
  static constexpr float infinity() { return __builtin_inff(); }
  static constexpr float max() { return 3.40282347e+38f; }
  static constexpr float lowest() { return -3.40282347e+38f; }
  static constexpr float quiet_NaN() { return __builtin_nanf(""); }
};
template <> struct numeric_limits<int> {
  static constexpr int max() { return 0x7fffffff; }
  static constexpr int min() { return -0x7fffffff - 1; }
};
template <> struct numeric_limits<uint> {
  static constexpr uint max() { return 0xffffffffu; }
  static constexpr uint min() { return 0u; }
};

}  // namespace metal

// A `threadgroup T name[N];` variable of a kernel body becomes a reference to this (see
// msl_clang.py): memory the threadgroup shares.
template <typename T> KF_DECL threadgroup T& kf_threadgroup_memory();
// The bytes of a kernel's threadgroup variables, which Metal limits to 32 KB per pipeline (feature
// set tables: maximum total threadgroup memory allocation); msl_clang.py asserts it per kernel.
#define KF_MAX_THREADGROUP_BYTES 32768ul
template <typename... T> constexpr unsigned long kf_threadgroup_bytes() { return (0ul + ... + sizeof(T)); }

// A bfloat operand of a conditional clang refuses only because of its address space (see the top and
// msl_strict.scalar_conditionals) becomes kf_rvalue(operand): a by-value parameter deduces T without
// address space or const, so any bfloat glvalue or prvalue gives a plain bfloat prvalue, as the
// lvalue-to-rvalue conversion of a scalar does in MSL.
template <typename T> KF_DECL T kf_rvalue(T x) KF_BODY(return x;)

// What MLX's metal::utils() adds in front of every custom kernel (mlx/backend/metal/kernels/
// bf16.h, utils.h): `using namespace metal;`, bfloat16_t = bfloat, float16_t = half.
using namespace metal;
typedef bfloat bfloat16_t;
typedef half float16_t;

// MSL's vector constructors (MSL spec 2.4 Vector Data Types, 2.12 Type Conversions), which neither
// clang's ext_vector_type nor kf_svec has: msl_clang.py rewrites every `T<n>(args)` of a kernel
// (T a scalar type, n 2, 3 or 4; not `T<n>()`) into `kf_make_vector<T<n>>(args)`:
// - one scalar: replicated (it converts implicitly to the element type);
// - one vector of n components: converted element by element, explicitly (float4(int4),
//   half4(float4), bfloat4(float4), float4(bfloat4) ...);
// - otherwise scalars and vectors whose components add up to n, in order: each scalar converts
//   implicitly to the element type, each vector has the element type (no implicit vector conversion).
// Refused with a static_assert otherwise (float4(a, b) of two scalars, float4(float3), float4(half2, half2)).
template <typename E, typename S> inline E kf_vector_element(S s) {
  if constexpr (is_same_v<S, E>) return s;
  else if constexpr (is_same_v<S, bfloat>) return static_cast<E>(float(s));  // exact; one conversion
  else return static_cast<E>(s);
}
template <typename V, typename A> inline void kf_vector_put(thread V& r, thread int& k, A a) {
  typedef typename kf_vector_info<V>::elem E;
  constexpr int m = kf_vector_info<A>::n;
  if constexpr (m == 0) {
    E e = a;  // a scalar argument converts implicitly to the element type (never a float to bfloat)
    r[k++] = e;
  } else {
    static_assert(is_same_v<typename kf_vector_info<A>::elem, E>,
                  "vector constructor: a vector argument of another element type (MSL converts vectors "
                  "only explicitly, one vector of as many components: T4(v4))");
    for (int j = 0; j < m; ++j) r[k++] = a[j];
  }
}
template <typename A> constexpr int kf_vector_components() {
  return kf_vector_info<A>::n == 0 ? 1 : kf_vector_info<A>::n;
}
template <typename V, typename... A> inline V kf_make_vector(A... a) {
  typedef typename kf_vector_info<V>::elem E;
  constexpr int n = kf_vector_info<V>::n;
  static_assert(n > 0, "kf_make_vector: not a vector type");
  V r;
  if constexpr (sizeof...(A) == 1 && ((kf_vector_info<A>::n == 0) && ...)) {  // splat
    E e = (a, ...);
    for (int k = 0; k < n; ++k) r[k] = e;
  } else if constexpr (sizeof...(A) == 1 && ((kf_vector_info<A>::n == n) && ...)) {  // conversion
    for (int k = 0; k < n; ++k) r[k] = kf_vector_element<E>((a, ...)[k]);
  } else {
    static_assert((0 + ... + kf_vector_components<A>()) == n,
                  "vector constructor: the arguments' components do not add up to the vector's (MSL spec "
                  "2.4: scalars and vectors, n components in all, or one scalar)");
    int k = 0;
    (kf_vector_put(r, k, a), ...);
  }
  return r;
}
