"""MoE router: softmax over experts, then the top ``k`` (k=2) -> ``[weights, indices]``.

Shape ``tokens x experts``. Outputs: weights (tokens x k, input dtype; the softmax
probabilities of the chosen experts, largest first, not renormalised) and indices (tokens x k,
uint32; compared exactly, ties go to the lower index). Built-in: ``mx.compile``d softmax +
``argpartition`` + a sort of the k winners.

Kernel: one warp per token (``tg / 32`` tokens per group); lane ``l`` holds experts
``it * 32 * V + l * V + [0, V)``. Max and sum by warp shuffles, then ``k`` rounds of a warp
arg-max (value, lower index wins) with the winner masked out. Axes: ``tg`` 32..1024 and
``vec`` 1/2/4/8 with ``experts % vec == 0`` and every lane owning a vector.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..common import DTYPES, ITEMSIZE, TOLERANCES, ceil_div, flat_rows, mx_dtype, need_rank, rng
from ..render.dialect import source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, Config, GpuBackend, KernelFn, KernelSpec, Shape

TOPK = 2
TGS = (32, 64, 128, 256, 512, 1024)
VECS = (1, 2, 4, 8)

BODY = r"""
  const unsigned lane = KF_LANE;
  const KF_SIZE row = KF_SIZE(KF_GROUP) * (TG / 32) + KF_WARP;
  const bool valid = row < KF_SIZE(x_shape[0]);
  float v[NITER * V];
#pragma unroll
  for (int it = 0; it < NITER; ++it) {
    const unsigned j = it * 32 + lane;
    if (valid && j < E / V) {
      kf_vec<T, V> a = kf_vload<V>(x + row * E, j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[it * V + k] = float(a.v[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[it * V + k] = -KF_INF;
      }
    }
  }
  float m = -KF_INF;
#pragma unroll
  for (int i = 0; i < NITER * V; ++i) {
    m = KF_FMAX(m, v[i]);
  }
  m = kf_warp_max(m);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < NITER * V; ++i) {
    s += KF_EXP(v[i] - m);
  }
  s = kf_warp_sum(s);
  const float inv = 1.0f / s;
  for (int kk = 0; kk < K; ++kk) {
    float best = -KF_INF;
    int bidx = 0x7fffffff;
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int e = (it * 32 + int(lane)) * V + k;
        if (v[it * V + k] > best) {
          best = v[it * V + k];
          bidx = e;
        }
      }
    }
#pragma unroll
    for (int msk = 16; msk > 0; msk >>= 1) {
      const float ov = kf_shfl_xor(best, msk);
      const int oi = kf_shfl_xor(bidx, msk);
      if (ov > best || (ov == best && oi < bidx)) {
        best = ov;
        bidx = oi;
      }
    }
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if ((it * 32 + int(lane)) * V + k == bidx) {
          v[it * V + k] = -KF_INF;
        }
      }
    }
    if (valid && lane == 0) {
      weights[row * K + kk] = T(KF_EXP(best - m) * inv);
      indices[row * K + kk] = unsigned(bidx);
    }
  }
"""

SOURCE = KernelSource("topk_gating_softmax", BODY, ("x",), ("weights", "indices"))


def _niter(E: int, vec: int) -> int:
    return ceil_div(E // vec, 32)


def valid_config(config: Config, E: int, dtype: str) -> bool:
    try:
        tg, vec = int(config["tg"]), int(config["vec"])
    except (KeyError, TypeError, ValueError):
        return False
    return (set(config) == {"tg", "vec"} and tg in TGS and vec in VECS and E % vec == 0
            and vec * ITEMSIZE[dtype] <= 16 and 32 * vec <= E and _niter(E, vec) * vec <= 64)


def space(shape: Shape, dtype: str) -> list[Config]:
    E = shape[-1]
    return [c for vec in VECS for tg in TGS if valid_config(c := {"tg": tg, "vec": vec}, E, dtype)]


def default_config(shape: Shape, dtype: str) -> Config:
    configs = space(shape, dtype)
    return max(configs, key=lambda c: (c["vec"], c["tg"] == 256))


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, k: int = TOPK) -> KernelFn:
    E = shape[-1]
    tg, vec = int(config["tg"]), int(config["vec"])

    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        x = inputs[0]
        lead = tuple(x.shape[:-1])
        x2 = flat_rows(x, E)
        rows = int(x2.shape[0])
        groups = max(1, ceil_div(rows, tg // 32))
        template = (("T", mx_dtype(dtype)), ("E", E), ("V", vec), ("TG", tg),
                    ("NITER", _niter(E, vec)), ("K", k))
        launch = Launch((groups * tg, 1, 1), (tg, 1, 1), template)
        w, idx = run(SOURCE, backend, [x2], launch, [(rows, k), (rows, k)], [x.dtype, mx.uint32])
        return [w.reshape(*lead, k), idx.reshape(*lead, k)]

    return fn


def reference(inputs: Sequence[mx.array], k: int = TOPK) -> list[mx.array]:
    x = inputs[0].astype(mx.float32)
    p = mx.softmax(x, axis=-1, precise=True)
    idx = mx.argsort(-x, axis=-1)[..., :k]
    return [mx.take_along_axis(p, idx, axis=-1), idx.astype(mx.uint32)]


def _gating(x: mx.array, k: int) -> tuple[mx.array, mx.array]:
    p = mx.softmax(x.astype(mx.float32), axis=-1)
    part = mx.argpartition(-p, kth=k - 1, axis=-1)[..., :k]
    vals = mx.take_along_axis(p, part, axis=-1)
    order = mx.argsort(-vals, axis=-1)
    idx = mx.take_along_axis(part, order, axis=-1)
    return mx.take_along_axis(vals, order, axis=-1).astype(x.dtype), idx.astype(mx.uint32)


_compiled = {kk: mx.compile(lambda x, kk=kk: _gating(x, kk)) for kk in (1, 2, 4, 8)}


def builtin(inputs: Sequence[mx.array], k: int = TOPK) -> list[mx.array]:
    fn = _compiled.get(k)
    w, idx = fn(inputs[0]) if fn is not None else _gating(inputs[0], k)
    return [w, idx]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    """Router logits without ties: each row is a permutation of distinct values k/8 - 4 (exact in
    every dtype), so the top-k indices are well defined and compared exactly."""
    _check(shape)
    tokens, E = shape
    g = rng(seed, 0)
    steps = np.argsort(g.random((tokens, E)), axis=-1).astype(np.float32)
    scale = 8.0 if E <= 64 else E / 8.0
    return [mx.array(steps / np.float32(scale) - np.float32(4.0)).astype(mx_dtype(dtype))]


def _check(shape: Shape) -> None:
    need_rank("topk_gating_softmax", shape, 2, "tokens x experts")
    E = shape[-1]
    if E < 32 * 1 or E > 2048 or E < TOPK:
        raise BadShape(f"topk_gating_softmax: experts must be between 32 and 2048, got {E}")


SPEC = KernelSpec(
    name="topk_gating_softmax",
    description="MoE router: softmax over experts then top-2 (weights, uint32 indices)",
    dtypes=DTYPES,
    shape_doc="tokens x experts",
    shapes={"decode": [(1, 64), (32, 64)], "large": [(16384, 64), (16384, 256)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=space,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (shape[0] * shape[1] * ITEMSIZE[dtype]
                                      + shape[0] * TOPK * (ITEMSIZE[dtype] + 4)),
    version=source_version(__file__),
    validate_shape=_check,
    test_shapes=[(37, 64), (5, 256)],
    default=default_config,
    exact_outputs=(1,),
)
