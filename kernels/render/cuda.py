"""CUDA spelling of the dialect, for ``mx.fast.cuda_kernel``.

MLX writes (see mlx/backend/cuda/custom_kernel.cpp): its default header (device/utils.cuh:
cuda_fp16, cuda_bf16, cuda::std; ``#define inf``), our header, then inside
``namespace mlx::core::cu`` a ``__global__`` function with inputs ``const T* name``, outputs
``T* name``, ``Shape name_shape`` when ``name_shape`` appears in the body, then the template
arguments as ``constexpr int N = ...;`` / ``using T = ...;`` lines, then our body. ``float16``
is ``__half``, ``bfloat16`` is ``__nv_bfloat16``. NVRTC compiles it without fast math. Never
name anything ``inf``.
"""

from __future__ import annotations

import re

TOKENS: dict[str, str] = {
    "KF_TID": "threadIdx.x",
    "KF_GROUP": "blockIdx.x",
    "KF_GID": "(blockIdx.x * blockDim.x + threadIdx.x)",
    "KF_LANE": "(threadIdx.x & 31u)",
    "KF_WARP": "(threadIdx.x >> 5)",
    "KF_BARRIER": "__syncthreads()",
    "KF_SHARED": "__shared__",
    "KF_DEVICE": "",
    "KF_UINT": "unsigned int",
    "KF_SIZE": "size_t",
    "KF_AS_FLOAT": "__uint_as_float",
    "KF_EXP": "expf",
    "KF_EXP_FAST": "__expf",
    "KF_LOG": "logf",
    "KF_SQRT": "sqrtf",
    "KF_RSQRT": "rsqrtf",
    "KF_TANH": "tanhf",
    "KF_ERF": "erff",
    "KF_COS": "cosf",
    "KF_SIN": "sinf",
    "KF_SINCOS": "sincosf",
    "KF_POW": "powf",
    "KF_FMAX": "fmaxf",
    "KF_FMIN": "fminf",
    "KF_INF": "__int_as_float(0x7f800000)",
}

PRELUDE = r"""
// ---- kernelfleet dialect prelude (CUDA) ----
template <typename T, int N>
struct alignas(sizeof(T) * N) kf_vec {
  T v[N];
};

// Vector load of elements [i*N, i*N+N); one wide load when the pointer is aligned (the same
// for every thread, so the branch never diverges), scalar loads otherwise.
template <int N, typename T>
__device__ __forceinline__ kf_vec<T, N> kf_vload(const T* p, size_t i) {
  if ((reinterpret_cast<size_t>(p) % sizeof(kf_vec<T, N>)) == 0) {
    return reinterpret_cast<const kf_vec<T, N>*>(p)[i];
  }
  kf_vec<T, N> r;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    r.v[k] = p[i * N + k];
  }
  return r;
}

template <int N, typename T>
__device__ __forceinline__ void kf_vstore(T* p, size_t i, const kf_vec<T, N>& r) {
  if ((reinterpret_cast<size_t>(p) % sizeof(kf_vec<T, N>)) == 0) {
    reinterpret_cast<kf_vec<T, N>*>(p)[i] = r;
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    p[i * N + k] = r.v[k];
  }
}

// The unsigned word of B bytes (one load or store instruction of that width).
template <int B> struct kf_word;
template <> struct kf_word<16> { using type = uint4; };
template <> struct kf_word<8> { using type = uint2; };
template <> struct kf_word<4> { using type = unsigned int; };
template <> struct kf_word<2> { using type = unsigned short; };

// kf_vload / kf_vstore with a cache-policy hint H (a template parameter, so it is a tuning axis):
// 0 the default policy; 1 streaming (ld.global.cs / st.global.cs: evict first, for data touched
// once); 2 loads through the non-coherent read-only path (ld.global.nc) and streaming stores.
template <int N, int H, typename T>
__device__ __forceinline__ kf_vec<T, N> kf_vload_h(const T* p, size_t i) {
  using W = typename kf_word<sizeof(T) * N>::type;
  if (H == 0 || (reinterpret_cast<size_t>(p) % sizeof(kf_vec<T, N>)) != 0) {
    return kf_vload<N>(p, i);
  }
  const W* q = reinterpret_cast<const W*>(p) + i;
  W w = (H == 1) ? __ldcs(q) : __ldg(q);
  kf_vec<T, N> r;
  memcpy(&r, &w, sizeof(W));
  return r;
}

template <int N, int H, typename T>
__device__ __forceinline__ void kf_vstore_h(T* p, size_t i, const kf_vec<T, N>& r) {
  using W = typename kf_word<sizeof(T) * N>::type;
  if (H == 0 || (reinterpret_cast<size_t>(p) % sizeof(kf_vec<T, N>)) != 0) {
    kf_vstore<N>(p, i, r);
    return;
  }
  W w;
  memcpy(&w, &r, sizeof(W));
  __stcs(reinterpret_cast<W*>(p) + i, w);
}

template <typename U>
__device__ __forceinline__ U kf_shfl_xor(U v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

// (a & mask) | c in one LOP3. Written plainly with two constants, ptxas emits two (a LOP3 takes
// one immediate): the quantized kernels' code-to-float step, (word & mask) | exponent, runs once
// per weight, so that is a third more of their instructions.
__device__ __forceinline__ unsigned int kf_and_or(unsigned int a, unsigned int mask, unsigned int c) {
  unsigned int d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(c));
  return d;
}

// Code j of a word of MLX's affine format (BITS 4 or 8) as a float: codes j and j + 16 / BITS (the same
// place b in the word's two halves) are one and-or's pair of float16 subnormals, code * 2^-24 exactly
// (at 4 bits the odd places 4 bits up: code * 2^-20), then one conversion each; kf_code_scale(b) is the
// factor x takes so that every place counts alike, kf_code_unit() the sums' (2^24). One and-or a pair
// and a shift a word, where the float magic takes an and-or and a subtraction a code.
template <int BITS>
__device__ __forceinline__ float kf_code(unsigned int word, int j) {
  constexpr int HALF = 16 / BITS;
  const int b = j % HALF;
  const int shift = BITS == 4 ? 8 * (b / 2) : 8 * b;
  const unsigned int mask = BITS == 4 ? (0x000F000Fu << (4 * (b % 2))) : 0x00FF00FFu;
  const unsigned int bits = (word >> shift) & mask;
  __half2 h;
  memcpy(&h, &bits, 4);
  return j < HALF ? __low2float(h) : __high2float(h);
}

template <int BITS>
__device__ __forceinline__ float kf_code_scale(int b) {
  return (BITS == 4 && (b % 2)) ? 0.0625f : 1.0f;
}

template <int BITS>
__device__ __forceinline__ float kf_code_unit() {
  return 16777216.0f;
}

__device__ __forceinline__ float kf_warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, m);
  }
  return v;
}

__device__ __forceinline__ float kf_warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  }
  return v;
}

// Sum over the warps that share one row: `wpr` consecutive warps; every thread of the row gets
// the same value. `buf` needs one slot per warp of the group; use a fresh buffer per call.
__device__ __forceinline__ float kf_row_sum(float v, float* buf, unsigned int lane,
                                            unsigned int warp, unsigned int wpr) {
  v = kf_warp_sum(v);
  if (wpr == 1) {
    return v;
  }
  if (lane == 0) {
    buf[warp] = v;
  }
  __syncthreads();
  unsigned int base = (warp / wpr) * wpr;
  float s = 0.0f;
  for (unsigned int i = 0; i < wpr; ++i) {
    s += buf[base + i];
  }
  return s;
}

__device__ __forceinline__ float kf_row_max(float v, float* buf, unsigned int lane,
                                            unsigned int warp, unsigned int wpr) {
  v = kf_warp_max(v);
  if (wpr == 1) {
    return v;
  }
  if (lane == 0) {
    buf[warp] = v;
  }
  __syncthreads();
  unsigned int base = (warp / wpr) * wpr;
  float m = buf[base];
  for (unsigned int i = 1; i < wpr; ++i) {
    m = fmaxf(m, buf[base + i]);
  }
  return m;
}
// ---- end prelude ----
"""


_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"//.*$")


def compact(text: str) -> str:
    """``text`` without comments, indentation or blank lines, one statement line to a line as before
    (so ``#pragma`` and ``#define`` lines keep theirs). MLX's CUDA backend hashes a custom kernel's
    whole source on every launch (``std::hash`` of it in ``CustomKernel::eval_gpu``, MLX 0.32): in a
    Llama-3-8B 4-bit decode step on an NVIDIA H200 that hash was 8.4 % of the patched loop's py-spy
    samples (``benchmarks/results/h200_model_decode_one_graph_ab.txt``, part 3). The step's five kernels'
    texts are 27-28 % shorter so (7.5-11.8 KB -> 5.4-8.6 KB), and ``std::hash`` of them took 1.04-1.64 us
    -> 0.75-1.18 us on a development host (some 47 us a 32-layer step there). No kernel text holds ``//``
    or ``/*`` inside a string literal (an ``asm`` string)."""
    lines = (_LINE_COMMENT.sub("", line).strip() for line in _BLOCK_COMMENT.sub("", text).splitlines())
    return "".join(line + "\n" for line in lines if line)
