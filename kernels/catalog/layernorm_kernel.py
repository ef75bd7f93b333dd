"""LayerNorm over the last dimension: ``(x - mean) * rsqrt(var + eps) * w + b``.

Shape ``rows x D``. Built-in: ``mx.fast.layer_norm``. Statistics over the row held in registers,
without cancellation, by one of two methods (the ``red`` axis): ``0`` two row reductions (the mean,
then the centred sum of squares); ``1`` one: each thread's exact (count, mean, centred sum of
squares) merged pairwise (Chan et al.), so a row spread over several warps waits at one barrier,
not two, as torch.compile's Welford kernel does (it beat ours by 8% at 16384x8192 on an H100).
Measured there, red=1 was 5-22% slower than red=0 (benchmarks/results/h100_frontier.txt): the
barriers were not what separates the two.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, normal
from ..render.dialect import float_literal
from ..render.launch import KernelSource
from ..spec import Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import rowwise

EPS = 1e-5

BODY = rowwise.LOAD_ROW + r"""
  KF_SHARED float red_a[32];
  KF_SHARED float red_b[32];
  KF_SHARED float red_c[32];
  float mean;
  float rstd;
  if (RED == 0) {
    // two row reductions: the mean, then the centred sum of squares
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NITER * V; ++i) {
      s += xv[i];
    }
    mean = kf_row_sum(s, red_a, KF_LANE, KF_WARP, TPR / 32) / float(D);
    float q = 0.0f;
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      if (it * TPR + t < D / V) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float c = xv[it * V + k] - mean;
          q += c * c;
        }
      }
    }
    rstd = KF_RSQRT(kf_row_sum(q, red_b, KF_LANE, KF_WARP, TPR / 32) / float(D) + ${EPS});
  } else {
    // one row reduction: each thread's (count, mean, centred sum of squares), exact over its
    // registers, merged pairwise (Chan et al.) over the warp, then the row's warps in order
    float n = 0.0f;
    float s = 0.0f;
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      if (it * TPR + t < D / V) {
        n += float(V);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          s += xv[it * V + k];
        }
      }
    }
    float mu = n > 0.0f ? s / n : 0.0f;
    float m2 = 0.0f;
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      if (it * TPR + t < D / V) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float c = xv[it * V + k] - mu;
          m2 += c * c;
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float nb = kf_shfl_xor(n, o);
      const float mb = kf_shfl_xor(mu, o);
      const float qb = kf_shfl_xor(m2, o);
      const float nn = n + nb;
      const float f = nn > 0.0f ? nb / nn : 0.0f;
      const float d = mb - mu;
      mu += d * f;
      m2 += qb + d * d * n * f;
      n = nn;
    }
    if (KF_LANE == 0) {  // the row's warps in order, so every thread of the row gets the same value
      red_a[KF_WARP] = n;
      red_b[KF_WARP] = mu;
      red_c[KF_WARP] = m2;
    }
    KF_BARRIER;
    const unsigned base = (KF_WARP / (TPR / 32)) * (TPR / 32);
    n = red_a[base];
    mu = red_b[base];
    m2 = red_c[base];
    for (unsigned w = 1; w < TPR / 32; ++w) {
      const float nb = red_a[base + w];
      const float nn = n + nb;
      const float f = nb / nn;
      const float d = red_b[base + w] - mu;
      mu += d * f;
      m2 += red_c[base + w] + d * d * n * f;
      n = nn;
    }
    mean = mu;
    rstd = KF_RSQRT(m2 / float(D) + ${EPS});
  }
  if (valid) {
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      const unsigned j = it * TPR + t;
      if (j < D / V) {
        kf_vec<T, V> wv = kf_vload<V>(w, j);
        kf_vec<T, V> bv = kf_vload<V>(b, j);
        kf_vec<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          o.v[k] = T((xv[it * V + k] - mean) * rstd * float(wv.v[k]) + float(bv.v[k]));
        }
        kf_vstore_h<V, H>(out + row * D, j, o);
      }
    }
  }
"""


def source(eps: float = EPS) -> KernelSource:
    return KernelSource("layernorm", BODY, ("x", "w", "b"), ("out",), (("EPS", float_literal(eps)),))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, eps: float = EPS) -> KernelFn:
    src = source(eps)

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        x, w, b = inputs
        return rowwise.run_rows(src, backend, config, dtype, [x], [w, b], ["row"])

    return fn


def reference(inputs: Sequence[mx.array], eps: float = EPS) -> list[mx.array]:
    x, w, b = (a.astype(mx.float32) for a in inputs)
    mean = mx.mean(x, axis=-1, keepdims=True)
    var = mx.mean(mx.square(x - mean), axis=-1, keepdims=True)
    return [(x - mean) * mx.rsqrt(var + eps) * w + b]


def builtin(inputs: Sequence[mx.array], eps: float = EPS) -> list[mx.array]:
    x, w, b = inputs
    return [mx.fast.layer_norm(x, w, b, eps)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    rowwise.check_shape("layernorm", shape)
    return [normal(shape, dtype, seed, 0, loc=0.5), normal(shape[-1:], dtype, seed, 1, scale=0.5, loc=1.0),
            normal(shape[-1:], dtype, seed, 2, scale=0.2)]


SPEC = KernelSpec(
    name="layernorm",
    description="LayerNorm over the last dim with weight and bias (eps=1e-5)",
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (2 * shape[0] * shape[1] + 2 * shape[1]) * ITEMSIZE[dtype],
    **rowwise.spec_fields("layernorm", __file__, axes=("red",)),
)
