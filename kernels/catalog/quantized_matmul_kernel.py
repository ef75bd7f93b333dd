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
  unpacked once for the M rows. A code becomes a float without an integer conversion: its bits are put in
  the mantissa of 2^23 (``KF_AS_FLOAT(code | 0x4B000000) - 2^23``). Per row and group
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx

from ..common import DTYPES, ITEMSIZE, ceil_div, mx_dtype, need_rank, normal
from ..render.dialect import source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BUILTIN, BadShape, Config, GpuBackend, KernelBuildError, KernelFn, KernelSpec, Shape
from . import affine, elementwise, quantized_mma

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
  const KF_SIZE n0 = (KF_SIZE(KF_GROUP) * (TG / 32 / KS) + KF_WARP / KS) * RPW;
  const int kw = KF_WARP % KS;
  if (n0 < KF_SIZE(N)) {
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
            q[u][r] = kf_vload<VW>(wq, ((n0 + r) * WPR + w0) / VW);
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
              kf_vec<T, XL> xv = kf_vload<XL>(x, (KF_SIZE(m) * K + w0 * PER) / XL + c);
#pragma unroll
              for (int e = 0; e < XL; ++e) {
                const float v = float(xv.v[e]);
                const int b = (c * XL + e) % HALF;
                xs[m] += v;
                xf[m][c * XL + e] = v * KF_AS_FLOAT(uint32_t(127 - BITS * b) << 23);
              }
            }
          }
#pragma unroll
          for (int r = 0; r < RPW; ++r) {
            const float sc = float(scales[(n0 + r) * (K / GS) + g]);
            const float bi = float(biases[(n0 + r) * (K / GS) + g]);
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
                const uint32_t half_word = j < HALF ? word : (word >> 16);
                const uint32_t mask = ((1u << BITS) - 1u) << (BITS * (j % HALF));
                const float wv = KF_AS_FLOAT(kf_and_or(half_word, mask, 0x4B000000u)) - 8388608.0f;
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
        if (KF_LANE == 0) {
          if (KS == 1) {
            out[KF_SIZE(m) * N + n0 + r] = T(v);
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
      for (int t = KF_LANE; t < OUTS; t += 32) {
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < KS; ++j) {
          v += part[(KF_WARP + j) * OUTS + t];
        }
        out[KF_SIZE(t / RPW) * N + n0 + t % RPW] = T(v);
      }
    }
  }
"""

QMV = KernelSource("qmv", QMV_BODY, ("x", "wq", "scales", "biases"), ("out",))

QMV_MAX_M = 8
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
    per = 32 // bits
    words_per_group = group // per
    configs: list[Config] = []
    if m <= QMV_MAX_M:
        steps = ceil_div(k * bits // 32, 32)
        configs += [{"path": "qmv", "rpw": rpw, "vw": vw, "tg": tg, "unr": unr}
                    for rpw in RPWS for vw in VWS for tg in QMV_TGS for unr in UNRS
                    if _qmv_fits(m, n, per, words_per_group, rpw, vw, unr)
                    and (unr == 1 or unr <= ceil_div(steps, vw))]
        # every warp of a block takes at least one block of unr steps
        configs += [{"path": "qmv_split", "rpw": rpw, "vw": vw, "tg": tg, "unr": unr}
                    for rpw in RPWS for vw in VWS for tg in SPLIT_TGS for unr in UNRS
                    if _qmv_fits(m, n, per, words_per_group, rpw, vw, unr)
                    and (tg // 32) * unr <= ceil_div(steps, vw)]
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


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
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
            return run(quantized_mma.SOURCE, backend, inputs, mma_launch, [(m, n)], [out_dtype])

        return mma
    rpw, vw, tg, unr = int(config["rpw"]), int(config["vw"]), int(config["tg"]), int(config["unr"])
    # warps sharing a row group's steps: qmv_split's whole block, qmv's one warp
    ks = tg // 32 if config["path"] == "qmv_split" else 1
    groups = max(1, ceil_div(n // rpw, tg // 32 // ks))
    template = (("T", mx_dtype(dtype)), ("K", k), ("N", n), ("BITS", bits), ("GS", group), ("MR", m),
                ("RPW", rpw), ("VW", vw), ("TG", tg), ("UNR", unr), ("KS", ks))
    launch = Launch((groups * tg, 1, 1), (tg, 1, 1), template)

    def qmv(inputs: Sequence[mx.array]) -> list[mx.array]:
        return run(QMV, backend, inputs, launch, [(m, n)], [out_dtype])

    return qmv


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    x, wq, sc, bi = inputs
    k = int(x.shape[-1])
    bits = 32 * int(wq.shape[-1]) // k
    group = k // int(sc.shape[-1])
    w = affine.reference_dequantize(wq, sc, bi, bits, group)
    return [mx.matmul(x.astype(mx.float32), w.T)]


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    x, wq, sc, bi = inputs
    k = int(x.shape[-1])
    bits = 32 * int(wq.shape[-1]) // k
    group = k // int(sc.shape[-1])
    return [mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=group, bits=bits)]


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
    version=source_version(__file__, affine.__file__, elementwise.__file__, quantized_mma.__file__),
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
