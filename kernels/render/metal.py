"""Metal (MSL) spelling of the dialect, for ``mx.fast.metal_kernel``.

MLX writes the kernel signature itself: inputs as ``const device T* name`` (``constant`` when
the array has fewer than 8 elements), outputs as ``device T* name``, template parameters as a
function template, and one ``[[attribute]]`` parameter for each attribute name found in the
body text (``thread_position_in_threadgroup`` ...). Its ``utils`` header (bfloat16_t, ...) comes
before our prelude. ``float16`` is ``float16_t`` (= ``half``), ``bfloat16`` is ``bfloat16_t``.
"""

from __future__ import annotations

TOKENS: dict[str, str] = {
    "KF_TID": "thread_position_in_threadgroup.x",
    "KF_GROUP": "threadgroup_position_in_grid.x",
    "KF_GID": "thread_position_in_grid.x",
    "KF_LANE": "thread_index_in_simdgroup",
    "KF_WARP": "simdgroup_index_in_threadgroup",
    "KF_BARRIER": "threadgroup_barrier(mem_flags::mem_threadgroup)",
    "KF_SHARED": "threadgroup",
    "KF_DEVICE": "device",
    "KF_UINT": "uint",
    "KF_SIZE": "size_t",
    "KF_AS_FLOAT": "as_type<float>",
    "KF_EXP": "metal::precise::exp",
    "KF_EXP_FAST": "metal::precise::exp",
    "KF_LOG": "metal::precise::log",
    "KF_SQRT": "metal::precise::sqrt",
    "KF_RSQRT": "metal::precise::rsqrt",
    "KF_TANH": "metal::precise::tanh",
    "KF_ERF": "kf_erf",
    "KF_COS": "metal::precise::cos",
    "KF_SIN": "metal::precise::sin",
    "KF_SINCOS": "kf_sincos",
    "KF_POW": "metal::precise::pow",
    "KF_FMAX": "metal::max",
    "KF_FMIN": "metal::min",
    "KF_INF": "INFINITY",
}

PRELUDE = r"""
// ---- kernelfleet dialect prelude (Metal) ----
template <typename T, int N>
struct kf_vec {
  T v[N];
};

template <int N, typename T>
inline kf_vec<T, N> kf_vload(const device T* p, size_t i) {
  kf_vec<T, N> r;
  for (int k = 0; k < N; ++k) {
    r.v[k] = p[i * N + k];
  }
  return r;
}

template <int N, typename T>
inline void kf_vstore(device T* p, size_t i, thread const kf_vec<T, N>& r) {
  for (int k = 0; k < N; ++k) {
    p[i * N + k] = r.v[k];
  }
}

// The cache-policy hint H of the CUDA spelling has no MSL counterpart (Metal has no per-access
// cache hints): the same loads and stores as kf_vload / kf_vstore.
template <int N, int H, typename T>
inline kf_vec<T, N> kf_vload_h(const device T* p, size_t i) {
  return kf_vload<N>(p, i);
}

template <int N, int H, typename T>
inline void kf_vstore_h(device T* p, size_t i, thread const kf_vec<T, N>& r) {
  kf_vstore<N>(p, i, r);
}

inline uint kf_and_or(uint a, uint mask, uint c) {
  return (a & mask) | c;
}

// Code j of a word of MLX's affine format (BITS 4 or 8) as a float: its bits in place in the mantissa of
// 2^23 (no shift), less 2^23, so the code at place b = j % (16 / BITS) of its half-word comes out times
// 2^(BITS * b); kf_code_scale(b) is the factor x takes for it, kf_code_unit() the sums' (none here).
template <int BITS>
inline float kf_code(uint word, int j) {
  const int places = 16 / BITS;  // codes a half-word ('half' is a type in Metal)
  const uint half_word = j < places ? word : (word >> 16);
  const uint mask = ((1u << BITS) - 1u) << (BITS * (j % places));
  return as_type<float>(kf_and_or(half_word, mask, 0x4B000000u)) - 8388608.0f;
}

template <int BITS>
inline float kf_code_scale(int b) {
  return as_type<float>(uint(127 - BITS * b) << 23);
}

template <int BITS>
inline float kf_code_unit() {
  return 1.0f;
}

inline float kf_warp_sum(float v) {
  return simd_sum(v);
}

inline float kf_warp_max(float v) {
  return simd_max(v);
}

template <typename U>
inline U kf_shfl_xor(U v, ushort mask) {
  return simd_shuffle_xor(v, mask);
}

// Sum over the warps that share one row: `wpr` consecutive warps; every thread of the row gets
// the same value. `buf` needs one slot per warp of the group; use a fresh buffer per call.
inline float kf_row_sum(float v, threadgroup float* buf, uint lane, uint warp, uint wpr) {
  v = simd_sum(v);
  if (wpr == 1) {
    return v;
  }
  if (lane == 0) {
    buf[warp] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint base = (warp / wpr) * wpr;
  float s = 0.0f;
  for (uint i = 0; i < wpr; ++i) {
    s += buf[base + i];
  }
  return s;
}

inline float kf_row_max(float v, threadgroup float* buf, uint lane, uint warp, uint wpr) {
  v = simd_max(v);
  if (wpr == 1) {
    return v;
  }
  if (lane == 0) {
    buf[warp] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint base = (warp / wpr) * wpr;
  float m = buf[base];
  for (uint i = 1; i < wpr; ++i) {
    m = metal::max(m, buf[base + i]);
  }
  return m;
}

// sin and cos of one argument (the CUDA spelling is sincosf, which shares the range reduction).
inline void kf_sincos(float x, thread float* s, thread float* c) {
  *s = metal::precise::sin(x);
  *c = metal::precise::cos(x);
}

// erf: Metal's standard library has none. 1 - erfc(|x|) with the Chebyshev-fitted erfc of
// Numerical Recipes (fractional error of erfc below 1.2e-7 everywhere).
inline float kf_erf(float x) {
  float a = metal::abs(x);
  float t = 1.0f / (1.0f + 0.5f * a);
  float y = 1.0f - t * metal::precise::exp(
      -a * a - 1.26551223f +
      t * (1.00002368f +
      t * (0.37409196f +
      t * (0.09678418f +
      t * (-0.18628806f +
      t * (0.27886807f +
      t * (-1.13520398f +
      t * (1.48851587f +
      t * (-0.82215223f +
      t * 0.17087277f)))))))));
  return x >= 0.0f ? y : -y;
}
// ---- end prelude ----
"""
