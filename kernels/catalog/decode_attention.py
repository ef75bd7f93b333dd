"""Attention of one new position per sequence over an mlx-lm ``KVCache``'s buffers, in one launch: what
``mx.fast.scaled_dot_product_attention(q, keys[..., :L, :], values[..., :L, :], scale=scale)`` computes
at a decode step (no mask) once ``update_and_fetch`` has written the step's keys and values, where
``keys`` and ``values`` are the cache's whole buffers and ``L`` the positions they hold with this step's
(RoPE's offset, an input, plus one). The step's own position is read from its keys and values (``kn``,
``vn``), the earlier ones from the buffers, so the result does not rest on the cache's write of this step,
which the layer block (:mod:`kernelfleet.kernels.patch.model_decode`) makes just before, as mlx-lm does.

Why a kernel of its own: a decode step at batch 1 is host time on a GPU. On MLX 0.32's CUDA backend a
decode step's attention over the cache's slices goes through cuDNN, whose per-call graph update costs
some 28 us of host time a layer (py-spy of a Llama-3-8B 4-bit decode loop on an NVIDIA H200,
``benchmarks/results/h200_decode_host_profile.txt``), against some 6-8 us for a custom kernel. Reading the
buffers' length at run time (``k_shape``), not as a template value, lets the layer block attend and run
the rest of the layer in one compiled graph whose shapes change only when the cache grows (every 256
positions), never per step.

One group of ``TG`` threads per (sequence, query head); grouped-query heads read their KV head
(``HQ / HKV`` query heads each). Each warp / SIMD group takes ``U`` positions at a time, every
``WARPS * U``-th block of them; a lane holds ``D / 32`` dims of q, of each key row and of its output
sum. Scores in float (q times the scale, as MLX scales q first), an online softmax per warp (its
running max, sum and weighted V), and the warps' partial results combined through shared memory:
float throughout, the output rounded once to ``T``.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..common import mx_dtype
from ..render.dialect import float_literal
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, GpuBackend, KernelFn

BODY = r"""
  constexpr int E = D / 32;  // dims a lane holds
  constexpr int WARPS = TG / 32;
  constexpr int GQ = HQ / HKV;
  const KF_SIZE bh = KF_SIZE(KF_GROUP);  // sequence * HQ + query head
  const KF_SIZE kvh = (bh / HQ) * HKV + (bh % HQ) / GQ;
  const int len = off[0] + 1;  // positions 0 .. len - 1: the cache's keys, this step's the last
  const KF_SIZE cap = KF_SIZE(k_shape[2]);  // the buffers' positions: a head's stride
  const int lane = int(KF_LANE);
  const int warp = int(KF_WARP);
  float qv[E];
  {
    const kf_vec<T, E> qr = kf_vload<E>(q, bh * (D / E) + KF_SIZE(lane));
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qv[e] = float(qr.v[e]) * ${SCALE};
    }
  }
  float best = -KF_INF;
  float sum = 0.0f;
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    acc[e] = 0.0f;
  }
  const KF_SIZE fresh = kvh * (D / E) + KF_SIZE(lane);  // this lane's dims of the step's own key and value
  for (int p0 = warp * U; p0 < len; p0 += WARPS * U) {
    kf_vec<T, E> kr[U];
    kf_vec<T, E> vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // past the end: the last position again, its weight 0 below; the last (this step's) from kn and vn
      const int p = p0 + u < len ? p0 + u : len - 1;
      const bool now = p == len - 1;
      const KF_SIZE row = now ? fresh : (kvh * cap + KF_SIZE(p)) * (D / E) + KF_SIZE(lane);
      kr[u] = kf_vload<E>(now ? kn : k, row);
      vr[u] = kf_vload<E>(now ? vn : v, row);
    }
    float s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        dot += qv[e] * float(kr[u].v[e]);
      }
      s[u] = kf_warp_sum(dot);
    }
    float top = best;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (p0 + u < len) {
        top = KF_FMAX(top, s[u]);
      }
    }
    const float keep = KF_EXP(best - top);  // 0 on the first block (best is -inf)
    sum *= keep;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      acc[e] *= keep;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float w = p0 + u < len ? KF_EXP(s[u] - top) : 0.0f;
      sum += w;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        acc[e] += w * float(vr[u].v[e]);
      }
    }
    best = top;
  }
  KF_SHARED float wmax[WARPS];
  KF_SHARED float wsum[WARPS];
  KF_SHARED float wacc[WARPS][D];
  if (lane == 0) {
    wmax[warp] = best;
    wsum[warp] = sum;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    wacc[warp][lane * E + e] = acc[e];
  }
  KF_BARRIER;
  for (int d = int(KF_TID); d < D; d += TG) {
    float top = -KF_INF;
    for (int w = 0; w < WARPS; ++w) {
      top = KF_FMAX(top, wmax[w]);
    }
    float total = 0.0f;
    float o = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      const float c = wsum[w] > 0.0f ? KF_EXP(wmax[w] - top) : 0.0f;  // a warp with no positions: 0
      total += wsum[w] * c;
      o += wacc[w][d] * c;
    }
    out[bh * D + KF_SIZE(d)] = T(o / total);
  }
"""

INPUTS = ("q", "kn", "vn", "k", "v", "off")
TG = 512  # 16 warps: at 1,024 positions each takes 64, 8 blocks of U
U = 8  # positions a warp loads before it reduces (loads in flight)
HEAD_DIMS = (32, 64, 128, 256)  # a lane holds D / 32 dims (a power of two: one vector load)
DTYPES = ("float32", "float16", "bfloat16")


def source(scale: float) -> KernelSource:
    return KernelSource("decode_attention", BODY, INPUTS, ("out",), (("SCALE", float_literal(scale)),))


def supports(heads: int, kv_heads: int, head_dim: int, dtype: str) -> bool:
    """Whether the kernel takes this attention: a head dim of :data:`HEAD_DIMS`, whole query-head groups."""
    return head_dim in HEAD_DIMS and kv_heads > 0 and heads % kv_heads == 0 and dtype in DTYPES


def make(backend: GpuBackend, batch: int, heads: int, kv_heads: int, head_dim: int, dtype: str,
         scale: float) -> KernelFn:
    """The launch for ``batch`` sequences of ``heads`` query heads over ``kv_heads`` KV heads: inputs q
    ``(batch, heads, 1, head_dim)``, the step's keys and values ``(batch, kv_heads, 1, head_dim)``, the
    cache's buffers of keys and values ``(batch, kv_heads, capacity, head_dim)`` (the positions below
    the offset read from them; the offset's own, this step's, from the step's keys and values) and RoPE's
    offset (int32, one element: the new position, below the capacity); output
    ``(batch, heads, 1, head_dim)``."""
    if not supports(heads, kv_heads, head_dim, dtype):
        raise BadShape(f"decode_attention: {heads} query heads over {kv_heads} KV heads of dim {head_dim} "
                       f"in {dtype}: the head dim must be one of {HEAD_DIMS}, in whole query-head groups")
    launch = Launch((batch * heads * TG, 1, 1), (TG, 1, 1),
                    (("T", mx_dtype(dtype)), ("D", head_dim), ("HQ", heads), ("HKV", kv_heads), ("TG", TG),
                     ("U", U)))
    src = source(scale)
    shape = [(batch, heads, 1, head_dim)]
    out_dtype = [mx_dtype(dtype)]

    def attend(inputs: Sequence[mx.array]) -> list[mx.array]:
        return run(src, backend, inputs, launch, shape, out_dtype)
    return attend


def reference(q: mx.array, keys: mx.array, values: mx.array, length: int, scale: float) -> mx.array:
    """The attention in float32 over the first ``length`` positions (grouped-query heads repeated)."""
    b, hq, _, d = q.shape
    hkv = keys.shape[1]
    k32 = mx.repeat(keys[:, :, :length].astype(mx.float32), hq // hkv, axis=1)
    v32 = mx.repeat(values[:, :, :length].astype(mx.float32), hq // hkv, axis=1)
    scores = (q.astype(mx.float32) * scale) @ k32.transpose(0, 1, 3, 2)
    return mx.softmax(scores, axis=-1) @ v32
