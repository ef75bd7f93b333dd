"""Quantized matmul in MLX's affine format: what ``mlx.nn.QuantizedLinear`` computes.

Shape ``M x K x N x bits x group``: ``M`` tokens (rows of ``x``), ``K`` input features, ``N`` output
features, ``bits`` 4 or 8, ``group`` 32, 64 or 128 (:mod:`kernelfleet.kernels.catalog.affine`). Inputs: ``x``
``(M, K)``, ``w_q`` uint32 ``(N, K * bits / 32)``, ``scales`` and ``biases`` ``(N, K / group)``; output
``x @ w.T`` ``(M, N)`` in ``x``'s dtype. Built-in: ``mx.quantized_matmul(..., transpose=True)``.

Three paths, a config axis (``path``), so the profile picks per exact shape, M included:

- ``qmv`` (M <= 8: decode, speculative and small batches): each warp / SIMD group computes ``rpw`` output
  features for all M rows. A lane takes ``vw`` packed words (16 bytes at ``vw`` 4) per step, the lanes of a
  warp consecutive words of a row, so each step is one coalesced sweep of ``rpw`` weight rows; the
  ``x`` values of a step are loaded and converted once and reused for the ``rpw`` rows, and each weight is
  unpacked once for the M rows. A code becomes a float without an integer conversion, left in its place in
  the word and scaled by that place (the dialect's ``kf_code``, with x's factor ``kf_code_scale`` and the
  sums' ``kf_code_unit``): on Metal its bits in the mantissa of 2^23, less 2^23; on CUDA two codes of one
  and-or as a pair of float16 subnormals, one conversion each (an and-or a pair instead of an and-or and a
  subtraction a code: 1.06-1.18x on an H200, ``h200_qmv_kf_code.txt``). Per row and group
  ``sum_k x*w = scale * sum_k x*code + bias * sum_k x``, accumulated in float; one warp sum per output.
- ``qmv_split`` (M <= 8, long rows): qmv with a block's ``tg / 32`` warps on the same ``rpw`` features, each
  taking every ``tg / 32``-th step of the row (the block reads one contiguous span of a row at a time); the
  warps' sums meet in shared memory. Short N with long K (14336 -> 4096) gets ``tg / 32`` times the warps
  qmv has, so more loads are in flight.
- ``mma`` (M <= 32, float16 and bfloat16, CUDA only): the weights dequantized in registers straight into
  the tensor cores' operand layout, so up to 32 tokens cost what one does
  (:mod:`kernelfleet.kernels.catalog.quantized_mma`).
- ``dq`` (any M, meant for prefill): the dequantize kernel (``affine.DEQUANT_BODY``) writes the weights in
  ``x``'s dtype, then MLX's own GEMM (``mx.matmul``, tensor cores) runs on them. At M=2048 the GEMM costs
  some 6x the dequantize, so this reaches most of the dense model's throughput.

Around the matmul, for a patched decoder layer (:mod:`kernelfleet.kernels.patch.model_layer`): :func:`make`'s
``norm`` (x RMS-normalised first, its weight one more input) and one epilogue, ``heads`` (q, k and v of one
position in attention's layout; with ``rope``, q and k rotated as ``mx.fast.rope`` rotates them), ``glu``
(the gated activation of the output's two halves) or ``residual`` (plus the last input). qmv and
qmv_split do them in their own launch (:func:`qmv_source`), since a launch costs host time a decode step
pays (``benchmarks/host_cost.py``); the other paths and the built-in run MLX's ops around the matmul.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import mlx.core as mx

from ..common import DTYPES, ITEMSIZE, ceil_div, mx_dtype, need_rank, normal
from ..render.dialect import float_literal, source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BUILTIN, BadShape, Config, GpuBackend, KernelBuildError, KernelFn, KernelSpec, Shape
from . import affine, elementwise, quantized_mma, quantized_mma_source, swiglu_kernel

QMV_BODY = r"""
  constexpr int PER = 32 / BITS;
  constexpr int HALF = PER / 2;
  constexpr int WPR = K * BITS / 32;
  constexpr int XV = VW * PER;
  constexpr int XL = XV < 8 ? XV : 8;
  constexpr int STEPS = (WPR + 32 * VW - 1) / (32 * VW);
  constexpr int ROUNDS = (STEPS + UNR * KS - 1) / (UNR * KS);
  constexpr int OUTS = MR * RPW;
  constexpr int PARTS = KS > 1 ? (TG / 32) * OUTS : 1;  // the warps' sums where they split K
  KF_SHARED float part[PARTS];
${PAIR_HEAD}
  const KF_SIZE n0 = (KF_SIZE(${GROUP}) * (TG / 32 / KS) + KF_WARP / KS) * RPW;
  const int kw = KF_WARP % KS;
  if (n0 < KF_SIZE(N)) {
${PROLOGUE}
    float acc[MR][RPW];
#pragma unroll
    for (int m = 0; m < MR; ++m) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        acc[m][r] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < ROUNDS; ++i) {
      const int s0 = (i * KS + kw) * UNR;
      kf_vec<uint32_t, VW> q[UNR][RPW];
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        const KF_SIZE w0 = KF_LANE * VW + KF_SIZE(s0 + u) * (32 * VW);
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          if (s0 + u < STEPS && w0 < KF_SIZE(WPR)) {
            q[u][r] = kf_vload<VW>(wq, (${ROW} * WPR + w0) / VW);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        const KF_SIZE w0 = KF_LANE * VW + KF_SIZE(s0 + u) * (32 * VW);
        if (s0 + u < STEPS && w0 < KF_SIZE(WPR)) {
          const KF_SIZE g = (w0 * PER) / GS;
          float xf[MR][XV];
          float xs[MR];
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            xs[m] = 0.0f;
#pragma unroll
            for (int c = 0; c < XV / XL; ++c) {
              kf_vec<T, XL> xv = kf_vload<XL>(x, (${XROW} * K + w0 * PER) / XL + c);
${XLOAD}
#pragma unroll
              for (int e = 0; e < XL; ++e) {
                const float v = ${XVAL};
                const int b = (c * XL + e) % HALF;
                xs[m] += v;
                xf[m][c * XL + e] = v * kf_code_scale<BITS>(b);
              }
            }
          }
#pragma unroll
          for (int r = 0; r < RPW; ++r) {
            const float sc = float(scales[${ROW} * (K / GS) + g]) * kf_code_unit<BITS>();
            const float bi = float(biases[${ROW} * (K / GS) + g]);
            float dot[MR];
#pragma unroll
            for (int m = 0; m < MR; ++m) {
              dot[m] = 0.0f;
            }
#pragma unroll
            for (int k = 0; k < VW; ++k) {
              const uint32_t word = q[u][r].v[k];
#pragma unroll
              for (int j = 0; j < PER; ++j) {
                const float wv = kf_code<BITS>(word, j);
#pragma unroll
                for (int m = 0; m < MR; ++m) {
                  dot[m] += xf[m][k * PER + j] * wv;
                }
              }
            }
#pragma unroll
            for (int m = 0; m < MR; ++m) {
              acc[m][r] += sc * dot[m] + bi * xs[m];
            }
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MR; ++m) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const float v = kf_warp_sum(acc[m][r]);
        acc[m][r] = v;
        if (KF_LANE == 0) {
          if (KS == 1) {
${STORE}
          } else {
            part[KF_WARP * OUTS + m * RPW + r] = v;
          }
        }
      }
    }
  }
  if (KS > 1) {
    KF_BARRIER;
    if (kw == 0 && n0 < KF_SIZE(N)) {
      // PAIR 2 (the gated epilogue): a lane takes an up row r and its gate row r - RPW / 2
      for (int t = KF_LANE; t < OUTS / ${PAIR}; t += 32) {
        const int m = t / (RPW / ${PAIR});
        const int r = t % (RPW / ${PAIR}) + (${PAIR} - 1) * (RPW / 2);
        float v = 0.0f;
        float gate = 0.0f;
#pragma unroll
        for (int j = 0; j < KS; ++j) {
          v += part[(KF_WARP + j) * OUTS + m * RPW + r];
          if (${PAIR} == 2) {
            gate += part[(KF_WARP + j) * OUTS + m * RPW + r - RPW / 2];
          }
        }
${STOREK}
      }
    }
  }
"""

# qmv's stores, one per epilogue (``${STORE}`` where a warp holds whole sums, in lane 0; ``${STOREK}`` where
# qmv_split's warps met in shared memory): output ``m``, weight row ``n0 + r``, its sum ``v``
_PLAIN = "            out[KF_SIZE(m) * N + n0 + r] = T(v);"
# the residual add as MLX's ``y + res`` computes it: y rounded to T first
_RESIDUAL = """            {
              const KF_SIZE i = KF_SIZE(m) * N + n0 + r;
              out[i] = T(float(T(v)) + float(res[i]));
            }"""
# q, k and v of one position, each (M, heads * head_dim): (batch, heads, 1, head_dim) in memory


def _heads_write(values: Sequence[tuple[str, str]]) -> str:
    """The stores of column ``c`` (of q, k and v joined) into q, k or v: each (offset, value) written at
    ``c`` + offset of the one tensor ``c`` falls in (the offsets stay inside c's head)."""
    def stores(out: str, stride: str, col: str) -> str:
        return "".join(f"\n                {out}[KF_SIZE(m) * {stride} + {col}{off}] = T({val});"
                       for off, val in values)
    return (f"              if (c < KF_SIZE(NQ)) {{{stores('oq', 'NQ', 'c')}\n"
            f"              }} else if (c < KF_SIZE(NQ + NKV)) {{{stores('ok', 'NKV', '(c - NQ)')}\n"
            f"              }} else {{{stores('ov', 'NKV', '(c - NQ - NKV)')}\n"
            "              }")


_HEADS = ("            {\n              const KF_SIZE c = n0 + r;\n" + _heads_write([("", "v")])
          + "\n            }")
# silu(gate) * up as the swiglu kernel computes it (both rounded to T first): a warp's rows are gate rows
# n0 / 2 .. n0 / 2 + RPW / 2 - 1 and the up rows N / 2 further on (``${ROW}``), so it holds both of a pair
_GLU_OUT = """              const float gb = float(T(gate));
              const float act = gb / (1.0f + KF_EXP(-gb)) * float(T(v));
              out[KF_SIZE(m) * (N / 2) + n0 / 2 + (r - RPW / 2)] = T(act);"""
_GLU = ("            if (r >= RPW / 2) {\n              const float gate = acc[m][(r + RPW / 2) % RPW];\n"
        + _GLU_OUT + "\n            }")
_GLU_ROW = "(r < RPW / 2 ? n0 / 2 + r : KF_SIZE(N / 2) + n0 / 2 + (r - RPW / 2))"
# q, k and v of one position with RoPE on q and k (``rope``): a warp's rows are RPW / 2 rotation pairs, the
# head dims d and d + HD / 2 of one head (rows r and r + RPW / 2), so it holds both of a pair; v's rows go in
# the same order, unrotated
_ROPE_PAIR = "(n0 / 2 + KF_SIZE(r % (RPW / 2)))"
_ROPE_ROW = (f"({_ROPE_PAIR} / (HD / 2) * HD + {_ROPE_PAIR} % (HD / 2) + KF_SIZE(r < RPW / 2 ? 0 : HD / 2))")
# ``lo`` and ``hi``: the sums of pair r - RPW / 2's rows (r in the upper half), rotated as mx.fast.rope
# rotates q and k (the matmul's output rounded to T first; theta = scale * offset / freqs[d], in float),
# then written as _HEADS writes them
_ROPE_OUT = """              const KF_SIZE pr = n0 / 2 + KF_SIZE(r - RPW / 2);
              const KF_SIZE c = pr / (HD / 2) * HD + pr % (HD / 2);
              float a = float(T(lo));
              float b = float(T(hi));
              if (c < KF_SIZE(NQ + NKV)) {
                const float theta = (${SCALE} * float(off[0])) * (1.0f / freqs[c % HD]);
                float sn;
                float cs;
                KF_SINCOS(theta, &sn, &cs);
                const float ra = a * cs - b * sn;
                b = b * cs + a * sn;
                a = ra;
              }
""" + _heads_write([("", "a"), (" + HD / 2", "b")])
_ROPE = ("            if (r >= RPW / 2) {\n              const float lo = acc[m][r - RPW / 2];\n"
         "              const float hi = v;\n" + _ROPE_OUT + "\n            }")
_ROPE_K = ("            {\n              const float lo = gate;\n              const float hi = v;\n"
           + _ROPE_OUT + "\n            }")


# the RMSNorm prologue (``norm``): each warp takes its rows' inverse RMS over K (x is a few KB, in cache)
# and normalises x as MLX's rms_norm does, ``w * T(x * inv)`` in T, before it meets the weights
_NORM_PROLOGUE = """    float inv[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      float ss = 0.0f;
      for (KF_SIZE c = KF_LANE; c < KF_SIZE(K / 8); c += 32) {
        const kf_vec<T, 8> xr = kf_vload<8>(x, KF_SIZE(m) * (K / 8) + c);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float t = float(xr.v[e]);
          ss += t * t;
        }
      }
      inv[m] = KF_RSQRT(kf_warp_sum(ss) / float(K) + ${EPS});
    }"""
_NORM_LOAD = "              const kf_vec<T, XL> nv = kf_vload<XL>(nw, (w0 * PER) / XL + c);"
_NORM_VALUE = "float(T(float(nv.v[e]) * float(T(float(xv.v[e]) * inv[m]))))"


def _qmv_source(name: str, store: str, inputs: tuple[str, ...] = (), outputs: tuple[str, ...] = ("out",),
                row: str = "(n0 + r)", pair: int = 1, store_k: str | None = None,
                norm: float | None = None, head: str = "", group: str = "KF_GROUP", xrow: str = "KF_SIZE(m)"
                ) -> KernelSource:
    values = [("PAIR_HEAD", head), ("GROUP", group), ("XROW", xrow),
              ("ROW", row), ("PAIR", str(pair)), ("STORE", store),
              ("STOREK", store if store_k is None else store_k),
              ("PROLOGUE", ""), ("XLOAD", ""), ("XVAL", "float(xv.v[e])")]
    if norm is not None:
        values[-3:] = [("PROLOGUE", _NORM_PROLOGUE.replace("${EPS}", float_literal(norm))),
                       ("XLOAD", _NORM_LOAD), ("XVAL", _NORM_VALUE)]
        name, inputs = f"{name}_norm", ("nw", *inputs)
    return KernelSource(name, QMV_BODY, ("x", "wq", "scales", "biases", *inputs), outputs, tuple(values))


@lru_cache(maxsize=64)
def qmv_source(epilogue: str = "", norm: float | None = None, rope: float | None = None) -> KernelSource:
    """qmv's kernel with an epilogue (``heads``, ``glu``, ``residual`` or none), the RMSNorm prologue at
    ``norm`` (its eps) or none, and with ``heads``, RoPE on q and k at ``rope`` (its scale) or none: one
    launch, no MLX ops before or after it."""
    if epilogue == "heads" and rope is not None:
        scale = float_literal(rope)
        return _qmv_source("qmv_heads_rope", _ROPE.replace("${SCALE}", scale), inputs=("off", "freqs"),
                           outputs=("oq", "ok", "ov"), row=_ROPE_ROW, pair=2,
                           store_k=_ROPE_K.replace("${SCALE}", scale), norm=norm)
    if epilogue == "heads":
        return _qmv_source("qmv_heads", _HEADS, outputs=("oq", "ok", "ov"), norm=norm)
    if epilogue == "glu":
        return _qmv_source("qmv_swiglu", _GLU, row=_GLU_ROW, pair=2,
                           store_k="            {\n" + _GLU_OUT + "\n            }", norm=norm)
    if epilogue == "residual":
        return _qmv_source("qmv_residual", _RESIDUAL, inputs=("res",), norm=norm)
    return _qmv_source("qmv", _PLAIN, norm=norm)


# the gathered form (mixture-of-experts pairs, :mod:`.gather_quantized_matmul_kernel`): a pair's blocks are
# consecutive groups of the grid, each reading its pair's expert from ``indices`` and its row of x (``XDIV``
# pairs in a row share one: a token's experts at up and gate)
_GATHER_HEAD = """  constexpr KF_SIZE BPP = (KF_SIZE(N) + RPW * (TG / 32 / KS) - 1) / (RPW * (TG / 32 / KS));
  const KF_SIZE pt = KF_SIZE(KF_GROUP) / BPP;
  const KF_SIZE ex = KF_SIZE(indices[pt]);"""
GATHER_QMV_SOURCE = _qmv_source("gather_qmv", "            out[pt * N + n0 + r] = T(v);", inputs=("indices",),
                                row="(ex * N + n0 + r)", head=_GATHER_HEAD, group="(KF_SIZE(KF_GROUP) % BPP)",
                                xrow="(pt / XDIV)")

QMV_MAX_M = 8
# the gated activations an epilogue computes: name -> its built-in on (gate, up)
GLUS: dict[str, Callable[[Sequence[mx.array]], Sequence[mx.array]]] = {"swiglu": swiglu_kernel.builtin}
RPWS = (1, 2, 4, 8)
VWS = (1, 2, 4)
QMV_TGS = (64, 128)
SPLIT_TGS = (64, 128, 256)  # qmv_split: 2, 4 or 8 warps share a row's steps
UNRS = (1, 2, 4)
DQ_TGS = (128, 256, 512)
DQ_VECS = (1, 2, 4)
MAX_XREGS = 64  # x values a lane holds per step (M x vw x values per word)
# the default where no profile entry exists: MLX's op for mid-size M, where neither path is known to win
DQ_MIN_M = 256


def _check(shape: Shape) -> None:
    need_rank("quantized_matmul", shape, 5, "tokens x in x out x bits x group")
    m, k, n, bits, group = shape
    affine.check_format("quantized_matmul", k, bits, group)


def _qmv_fits(m: int, n: int, per: int, words_per_group: int, rpw: int, vw: int, unr: int) -> bool:
    """Whether qmv's (and qmv_split's) axes fit the shape and a lane's registers."""
    return (n % rpw == 0 and words_per_group % vw == 0 and m * vw * per <= MAX_XREGS
            and unr * rpw * vw <= 32)


def space(shape: Shape, dtype: str) -> list[Config]:
    m, k, n, bits, group = shape
    words_per_group = group * bits // 32
    configs: list[Config] = qmv_space(m, k, n, bits, group) if m <= QMV_MAX_M else []
    # the same axes for every path: dq's vw is the words a thread dequantizes per step (rpw, unr fixed at 1)
    configs += quantized_mma.space(shape, dtype)
    configs += [{"path": "dq", "rpw": 1, "vw": vec, "tg": tg, "unr": 1} for vec in DQ_VECS for tg in DQ_TGS
                if words_per_group % vec == 0]
    return configs


def default(shape: Shape, dtype: str) -> Config:
    m = shape[0]
    valid = space(shape, dtype)
    if m <= QMV_MAX_M:
        for vw in (4, 2, 1):
            for unr in (2, 1):
                want: Config = {"path": "qmv", "rpw": 2, "vw": vw, "tg": 128, "unr": unr}
                if want in valid:
                    return want
    if m >= DQ_MIN_M:
        return {"path": "dq", "rpw": 1, "vw": 1, "tg": 256, "unr": 1}
    return dict(BUILTIN)


# the paths expected fastest first, by M, in tiers (H200 runs, benchmarks/results/h200_quantized_mma.txt,
# h200_qmv_split.txt): qmv_split and qmv at one token (split K won at all five decode shapes under ncu,
# 1.06-1.59x; a tier, each later path of it half a step behind, so the model search measures qmv_split's
# typical config and its neighbours, and qmv's typical one); the tensor cores from 2 to 32 (where they are
# offered: CUDA, 16-bit activations), else the qmv tier to 8; dequantize + GEMM above
def _path_order(m: int) -> tuple[tuple[str, ...], ...]:
    if m == 1:
        return (("qmv_split", "qmv"), ("mma",), ("dq",))
    if m <= quantized_mma.MAX_M:
        return (("mma",), ("qmv_split", "qmv"), ("dq",))
    return (("dq",),)


# each path's typical winner: the prior's other axis is the distance from it
TYPICAL: dict[str, Config] = {"qmv": {"rpw": 4, "vw": 4, "tg": 128, "unr": 1},
                              "qmv_split": {"rpw": 8, "vw": 4, "tg": 64, "unr": 1},
                              "mma": {"rpw": 32, "vw": 4, "tg": 128, "unr": 1},
                              "dq": {"rpw": 1, "vw": 1, "tg": 256, "unr": 1}}


def prior(shape: Shape, dtype: str, config: Config) -> float:
    """A config's expected cost rank (lower first, for the ``model`` search and capped candidate lists):
    its path's tier in :func:`_path_order` by tens and its place in the tier by halves, then its distance
    (log2 per axis) from the path's typical winner."""
    path = str(config.get("path"))
    rank = 100.0
    for i, tier in enumerate(_path_order(shape[0])):
        if path in tier:
            rank = 10.0 * i + 0.5 * tier.index(path)
    typical = TYPICAL.get(path, {})
    return rank + sum(abs(math.log2(int(config[k]) / v)) for k, v in typical.items() if k in config)


def _check_epilogue(shape: Shape, heads: tuple[int, ...], glu: str, residual: bool,
                    rope: float | None = None) -> str:
    """The epilogue the parameters ask for ("" for none), after checking them against ``shape``."""
    m, k, n = shape[:3]
    if heads and (len(heads) != 4 or heads[0] != m or (heads[1] + 2 * heads[2]) * heads[3] != n):
        raise BadShape(f"quantized_matmul: heads (batch, q heads, kv heads, head dim) = {heads} does not "
                       f"split {m} rows of {n} outputs")
    if rope is not None and not (heads and heads[3] % 2 == 0):
        raise BadShape("quantized_matmul: rope rotates q and k of the heads epilogue, over an even head dim")
    if glu and (glu not in GLUS or n % 2):
        raise BadShape(f"quantized_matmul: glu {glu!r} takes one of {sorted(GLUS)} over an even N")
    asked = [name for name, on in (("heads", heads), ("glu", glu), ("residual", residual)) if on]
    if len(asked) > 1:
        raise BadShape("quantized_matmul: one epilogue at a time (heads, glu or residual)")
    return asked[0] if asked else ""


def epilogue(y: mx.array, rest: Sequence[mx.array], heads: tuple[int, ...] = (), glu: str = "",
             residual: bool = False, rope: float | None = None) -> list[mx.array]:
    """The epilogue a caller asked for, in MLX's ops on the matmul's output ``y`` (M, N): the built-in,
    and the paths without it in the kernel. ``heads``: q, k and v of one position (the batch's M rows),
    each ``(batch, heads, 1, head_dim)``, and with ``rope`` (its scale) q and k rotated as
    ``mx.fast.rope(t, head_dim, traditional=False, base=None, scale=rope, offset=rest[-2],
    freqs=rest[-1])`` rotates them; ``glu``: the gated activation of ``y``'s two halves (the activation
    kernel's built-in); ``residual``: ``y + rest[-1]``."""
    if heads:
        b, hq, hkv, hd = heads
        parts = mx.split(y, [hq * hd, (hq + hkv) * hd], axis=-1)
        q, k, v = (t.reshape(b, h, 1, hd) for t, h in zip(parts, (hq, hkv, hkv), strict=True))
        if rope is not None:
            q, k = (mx.fast.rope(t, hd, traditional=False, base=None, scale=rope, offset=rest[-2],
                                 freqs=rest[-1]) for t in (q, k))
        return [q, k, v]
    if glu:
        half = int(y.shape[-1]) // 2
        return list(GLUS[glu]([y[:, :half], y[:, half:]]))
    if residual:
        return [y + rest[-1]]
    return [y]


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, heads: tuple[int, ...] = (),
         glu: str = "", residual: bool = False, norm: float | None = None, rope: float | None = None
         ) -> KernelFn:
    """The kernel for ``config``. With an epilogue (:func:`epilogue`'s parameters) or ``norm`` (x is
    RMS-normalised first, as ``mx.fast.rms_norm(x, w, norm)``: its weight ``w`` one more input, after the
    matmul's four), qmv and qmv_split do it in the launch itself (the gated epilogue and RoPE at ``rpw``
    >= 2: a warp holds row pairs), the other paths in MLX's ops around the matmul. A residual is the last
    input; RoPE's offset (int32, one element) and freqs (float32, head dim / 2) the last two."""
    kind = _check_epilogue(shape, heads, glu, residual, rope)
    pairs = bool(glu) or rope is not None
    if config["path"] in ("qmv", "qmv_split") and not (pairs and int(config["rpw"]) < 2):
        return _qmv(config, backend, shape, dtype, kind, norm, heads, rope)
    plain = _make(config, backend, shape, dtype)
    if not kind and norm is None:
        return plain

    def around(inputs: Sequence[mx.array]) -> list[mx.array]:
        x = inputs[0] if norm is None else mx.fast.rms_norm(inputs[0], inputs[4], norm)
        return epilogue(plain([x, *inputs[1:4]])[0], inputs[4:], heads, glu, residual, rope)
    return around


def _qmv(config: Config, backend: GpuBackend, shape: Shape, dtype: str, kind: str = "",
         norm: float | None = None, heads: tuple[int, ...] = (), rope: float | None = None) -> KernelFn:
    """qmv or qmv_split in one launch, with the epilogue ``kind`` (and RoPE) and the norm prologue where
    asked."""
    m, n = shape[0], shape[2]
    launch = _qmv_launch(config, shape, dtype, heads)
    out_dtype = mx_dtype(dtype)
    shapes: list[tuple[int, ...]]
    if heads:
        b, hq, hkv, hd = heads
        shapes = [(b, hq, 1, hd), (b, hkv, 1, hd), (b, hkv, 1, hd)]
    else:
        shapes = [(m, n // 2)] if kind == "glu" else [(m, n)]
    src = qmv_source(kind, norm, rope)

    def qmv(inputs: Sequence[mx.array]) -> list[mx.array]:
        return run(src, backend, inputs, launch, shapes, [out_dtype] * len(shapes))

    return qmv


def _qmv_launch(config: Config, shape: Shape, dtype: str, heads: tuple[int, ...] = (), pairs: int = 0
                ) -> Launch:
    """qmv's geometry; with ``pairs``, the gathered form's (:data:`GATHER_QMV_SOURCE`): one x row a pair
    and each pair's blocks in turn."""
    m, k, n, bits, group = shape
    rpw, vw, tg, unr = int(config["rpw"]), int(config["vw"]), int(config["tg"]), int(config["unr"])
    # warps sharing a row group's steps: qmv_split's whole block, qmv's one warp
    ks = tg // 32 if config["path"] == "qmv_split" else 1
    groups = max(1, ceil_div(n // rpw, tg // 32 // ks)) * max(1, pairs)
    template: tuple[tuple[str, Any], ...] = (
        ("T", mx_dtype(dtype)), ("K", k), ("N", n), ("BITS", bits), ("GS", group), ("MR", m), ("RPW", rpw),
        ("VW", vw), ("TG", tg), ("UNR", unr), ("KS", ks))
    if heads:
        template += (("NQ", heads[1] * heads[3]), ("NKV", heads[2] * heads[3]), ("HD", heads[3]))
    return Launch((groups * tg, 1, 1), (tg, 1, 1), template)


def qmv_space(m: int, k: int, n: int, bits: int, group: int) -> list[Config]:
    """qmv's and qmv_split's configs for ``m`` rows of x over an ``n x k`` weight."""
    per = 32 // bits
    words_per_group = group // per
    steps = ceil_div(k * bits // 32, 32)
    configs: list[Config] = [{"path": "qmv", "rpw": rpw, "vw": vw, "tg": tg, "unr": unr}
                             for rpw in RPWS for vw in VWS for tg in QMV_TGS for unr in UNRS
                             if _qmv_fits(m, n, per, words_per_group, rpw, vw, unr)
                             and (unr == 1 or unr <= ceil_div(steps, vw))]
    # every warp of a block takes at least one block of unr steps
    configs += [{"path": "qmv_split", "rpw": rpw, "vw": vw, "tg": tg, "unr": unr}
                for rpw in RPWS for vw in VWS for tg in SPLIT_TGS for unr in UNRS
                if _qmv_fits(m, n, per, words_per_group, rpw, vw, unr)
                and (tg // 32) * unr <= ceil_div(steps, vw)]
    return configs


def gather_qmv_launch(config: Config, pairs: int, k: int, n: int, bits: int, group: int, dtype: str,
                      shared_x: int = 1) -> Launch:
    """The gathered qmv's launch: ``pairs`` (token, expert) pairs, each one row of x against its expert,
    ``shared_x`` pairs in a row on the same row of x."""
    plain = _qmv_launch(config, (1, k, n, bits, group), dtype, pairs=pairs)
    return Launch(plain.grid, plain.threadgroup, (*plain.template, ("XDIV", shared_x)))


def _make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    m, k, n, bits, group = shape
    if config["path"] == "dq":
        dq = {"tg": int(config["tg"]), "vec": int(config["vw"]), "ipt": 1}

        def dequant_matmul(inputs: Sequence[mx.array]) -> list[mx.array]:
            x, wq, sc, bi = inputs
            w = affine.dequantize(dq, backend, wq, sc.astype(x.dtype), bi.astype(x.dtype), bits, group)
            return [mx.matmul(x, w.T)]

        return dequant_matmul
    out_dtype = mx_dtype(dtype)
    if config["path"] == "mma":
        if backend != "cuda":
            raise KernelBuildError("quantized_matmul: the mma path runs on CUDA's tensor cores only")
        mma_launch = quantized_mma.launch(config, shape, dtype)

        def mma(inputs: Sequence[mx.array]) -> list[mx.array]:
            return run(quantized_mma_source.SOURCE, backend, inputs, mma_launch, [(m, n)], [out_dtype])

        return mma
    return _qmv(config, backend, shape, dtype)


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    x, wq, sc, bi = inputs
    k = int(x.shape[-1])
    bits = 32 * int(wq.shape[-1]) // k
    group = k // int(sc.shape[-1])
    w = affine.reference_dequantize(wq, sc, bi, bits, group)
    return [mx.matmul(x.astype(mx.float32), w.T)]


def builtin(inputs: Sequence[mx.array], heads: tuple[int, ...] = (), glu: str = "",
            residual: bool = False, norm: float | None = None, rope: float | None = None) -> list[mx.array]:
    x, wq, sc, bi = inputs[:4]
    if norm is not None:
        x = mx.fast.rms_norm(x, inputs[4], norm)
    k = int(x.shape[-1])
    bits = 32 * int(wq.shape[-1]) // k
    group = k // int(sc.shape[-1])
    y = mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=group, bits=bits)
    return epilogue(y, inputs[4:], heads, glu, residual, rope)


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    _check(shape)
    m, k, n, bits, group = shape
    return [normal((m, k), dtype, seed), *affine.random_weights(n, k, bits, group, dtype, seed, salt=1)]


def bytes_moved(shape: Shape, dtype: str) -> int:
    m, k, n, bits, group = shape
    return affine.weight_bytes(n, k, bits, group, dtype) + (m * k + m * n) * ITEMSIZE[dtype]


def _validate(shape: Shape) -> None:
    _check(shape)
    if shape[0] <= 0:
        raise BadShape("quantized_matmul: M must be positive")


SPEC = KernelSpec(
    name="quantized_matmul",
    description="x @ w.T with w in MLX's affine format (4/8 bits, group 32/64/128): qmv or dequantize + GEMM",
    dtypes=DTYPES,
    shape_doc="tokens x in x out x bits x group",
    shapes={
        "decode": [(1, 4096, 4096, 4, 64), (1, 4096, 14336, 4, 64), (1, 14336, 4096, 4, 64),
                   (1, 4096, 128256, 4, 64), (1, 4096, 14336, 8, 64), (8, 4096, 14336, 4, 64)],
        "large": [(2048, 4096, 14336, 4, 64), (2048, 14336, 4096, 4, 64), (2048, 4096, 14336, 8, 64)],
    },
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=space,
    build=make,
    tolerances=affine.MATMUL_TOLERANCES,
    bytes_moved=bytes_moved,
    version=source_version(__file__, affine.__file__, elementwise.__file__, quantized_mma.__file__,
                           quantized_mma_source.__file__),
    validate_shape=_validate,
    # K=640: a lane's last step is partial (80 words), and at vw 1 an unrolled block of 2 runs past the last
    # of 3 steps. Longer K is left to GPU runs: MLX's CPU op in bfloat16 (the built-in, checked here too)
    # was off by 0.05-0.53 at K=768-1152 over three seeds, and by 0.2 at K=640 for M >= 2.
    # (13, 128, 48, 4, 32) and (24, 128, 32, 8, 64): the mma path with 2 and 3 token tiles, the last partial
    test_shapes=[(1, 256, 16, 4, 64), (3, 128, 8, 8, 32), (1, 640, 8, 4, 128), (12, 128, 8, 4, 32),
                 (13, 128, 48, 4, 32), (24, 128, 32, 8, 64)],
    default=default,
    prior=prior,
    config_backends=quantized_mma.config_backends,
    # x, the output, and the dq path's dense weights
    largest_tensor=lambda shape: max(shape[0] * shape[1], shape[0] * shape[2], shape[1] * shape[2]),
)
