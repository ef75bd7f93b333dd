"""Gathered quantized matmul, the mixture-of-experts form: what mlx-lm's ``QuantizedSwitchLinear`` computes
with ``mx.gather_qmm``, on (token, expert) pairs sorted by expert where ``SwitchGLU`` sorts them (64 or more
pairs: prefill, larger batches) and, in the decode form below 64 (:func:`make`'s ``shared_x`` and
``sorted_pairs``), in the router's order.

Shape ``T x K x N x E x bits x group``: ``T`` (token, expert) pairs, ``K`` input and ``N`` output features,
``E`` experts, ``bits`` 4 or 8, ``group`` 32, 64 or 128 (:mod:`kernelfleet.kernels.catalog.affine`).
Inputs: ``x`` ``(T, K)``, ``w_q`` uint32 ``(E, N, K * bits / 32)``, ``scales`` and ``biases``
``(E, N, K / group)``, and ``indices`` uint32 ``(T,)`` sorted ascending (the decode form: any order); output
``out[t] = x[t] @ w[indices[t]].T``, ``(T, N)``.
Built-in: ``mx.gather_qmm(..., transpose=True, sorted_indices=True)``.

Three kinds of path, a config axis (``path``):

- ``qmv`` and ``qmv_split`` (up to 64 pairs: decode; below 64, where mlx-lm leaves the pairs unsorted, the
  only paths offered): :mod:`.quantized_matmul_kernel`'s matvec, gathered
  (``GATHER_QMV_SOURCE``): each pair's blocks read its expert's index and compute its one row of x against
  that expert's weights, in any order of pairs (sorted or not). At one token, a pair's 2048x768 expert is
  a few hundred KB, so the launch is short and the blocks of all pairs run at once.
- ``mma`` (CUDA, float16 and bfloat16): :mod:`.quantized_mma`'s tensor-core kernel, gathered. A block takes
  ``mt`` (16 or 32) consecutive pairs and ``rpw`` output features; since the pairs come sorted, its pairs
  hold a run of experts, and it computes each expert present with that expert's weights, dequantized in
  registers, storing only that expert's pairs (a tile inside one expert's run: one pass). Nothing is
  written to memory but the output. On an H200, 16,384 pairs of Qwen3-30B-A3B's experts took 663 µs
  against 10.6 ms for ``gather_qmm`` (16x; ``benchmarks/results/h200_gather_mma.txt``); at 64 pairs (a
  decode batch of 8) it is slower than MLX's op and the profile keeps the op.
- ``dq``: the dequantize kernel (``affine.DEQUANT_BODY``) writes every expert's weights in ``x``'s dtype,
  then MLX's ``mx.gather_mm`` runs the grouped GEMM on them (not told the pairs are sorted: on an H100, MLX
  0.32.4's sorted gather_mm returned wrong results here). Its cost is one pass over all experts per call,
  and the unsorted gather_mm is itself slow (6.6-10.3 ms at 16,384 pairs on the H200), so it pays little;
  it is what Metal workers run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..common import DTYPES, ITEMSIZE, mx_dtype, need_rank, normal, rng
from ..render.dialect import source_version
from ..render.launch import run
from ..spec import BadShape, Config, GpuBackend, KernelBuildError, KernelFn, KernelSpec, Shape
from . import affine, elementwise, quantized_mma, quantized_mma_source
from . import quantized_matmul_kernel as qmk
from .quantized_matmul_kernel import DQ_TGS, DQ_VECS

# mlx-lm's SwitchGLU sorts its pairs by expert from this many on; below, they come in the router's order,
# which only the qmv paths take, so they are all the space offers there
SORTED_MIN_PAIRS = 64
# the paths that take pairs in any order, and so the decode form (make's shared_x, sorted_pairs)
ORDER_FREE = ("qmv", "qmv_split")
# pairs up to which the qmv paths are offered: a decode batch of 8 tokens at 8 experts each (each pair reads
# its expert's weights itself, so at prefill sizes they would read every expert many times over)
QMV_MAX_PAIRS = 64


def _check(shape: Shape) -> None:
    need_rank("gather_quantized_matmul", shape, 6, "pairs x in x out x experts x bits x group")
    t, k, n, e, bits, group = shape
    affine.check_format("gather_quantized_matmul", k, bits, group)
    if e < 1:
        raise BadShape("gather_quantized_matmul: at least one expert")


def space(shape: Shape, dtype: str) -> list[Config]:
    t, k, n, e, bits, group = shape
    words_per_group = group * bits // 32
    qmv = qmk.qmv_space(1, k, n, bits, group) if t <= QMV_MAX_PAIRS else []
    if t < SORTED_MIN_PAIRS:
        return qmv
    return qmv + quantized_mma.gather_space(shape, dtype) + [
        {"path": "dq", "vw": vec, "tg": tg} for vec in DQ_VECS for tg in DQ_TGS if words_per_group % vec == 0]


# the qmv paths first at decode sizes (up to QMV_MAX_PAIRS), then the tensor cores where they are offered,
# then dequantize + gather_mm; within the path, the distance (log2 per axis) from its typical winner
TYPICAL: dict[str, Config] = {"qmv": {"rpw": 4, "vw": 4, "tg": 64, "unr": 1},
                              "qmv_split": {"rpw": 4, "vw": 4, "tg": 128, "unr": 1},
                              "mma": {"rpw": 32, "tg": 128, "unr": 1, "mt": 32}, "dq": {"vw": 1, "tg": 256}}
RANKS = {"qmv": 0, "qmv_split": 0.5, "mma": 1, "dq": 2}


def default(shape: Shape, dtype: str) -> Config:
    """Dequantize + gather_mm where the pairs come sorted; under 64 pairs (unsorted) qmv's typical config,
    else its first that fits the shape."""
    if shape[0] >= SORTED_MIN_PAIRS:
        return {"path": "dq", "vw": 1, "tg": 256}
    qmv = qmk.qmv_space(1, *shape[1:3], *shape[4:6])
    typical = {"path": "qmv", **TYPICAL["qmv"]}
    return typical if typical in qmv else qmv[0]


def prior(shape: Shape, dtype: str, config: Config) -> float:
    path = str(config.get("path"))
    typical = TYPICAL.get(path, {})
    rank = RANKS.get(path, 3)
    return 10.0 * rank + sum(abs(math.log2(int(config[k]) / v)) for k, v in typical.items() if k in config)


def _check_decode_form(shape: Shape, shared_x: int) -> None:
    if shared_x < 1 or shape[0] % shared_x:
        raise BadShape(f"gather_quantized_matmul: {shape[0]} pairs do not share x rows {shared_x} at a time")


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str, shared_x: int = 1,
         sorted_pairs: bool = True) -> KernelFn:
    """The kernel for ``config``. The decode form, for the qmv paths alone (order-free): ``shared_x`` pairs
    in a row share one row of x (a token's experts at up and gate: x is ``(T / shared_x, K)``), and
    ``sorted_pairs`` False says the pairs are in the router's order."""
    t, k, n, e, bits, group = shape
    _check_decode_form(shape, shared_x)
    if config["path"] not in ORDER_FREE and (shared_x != 1 or not sorted_pairs):
        raise KernelBuildError(f"gather_quantized_matmul: the {config['path']} path takes sorted pairs, one "
                               "row of x each")
    if config["path"] in ORDER_FREE:
        qmv_launch = qmk.gather_qmv_launch(config, t, k, n, bits, group, dtype, shared_x)
        out_dtype = mx_dtype(dtype)

        def qmv(inputs: Sequence[mx.array]) -> list[mx.array]:
            return run(qmk.GATHER_QMV_SOURCE, backend, inputs, qmv_launch, [(t, n)], [out_dtype])

        return qmv
    if config["path"] == "mma":
        if backend != "cuda":
            raise KernelBuildError("gather_quantized_matmul: the mma path runs on CUDA's tensor cores only")
        mma_launch, out_dtype = quantized_mma.gather_launch(config, shape, dtype), mx_dtype(dtype)

        def mma(inputs: Sequence[mx.array]) -> list[mx.array]:
            return run(quantized_mma_source.GATHER_SOURCE, backend, inputs, mma_launch, [(t, n)], [out_dtype])

        return mma
    dq = {"tg": int(config["tg"]), "vec": int(config["vw"]), "ipt": 1}

    def dequant_gather(inputs: Sequence[mx.array]) -> list[mx.array]:
        x, wq, sc, bi, idx = inputs
        w = affine.dequantize(dq, backend, wq, sc.astype(x.dtype), bi.astype(x.dtype), bits, group)
        w = w.reshape(e, n, k)
        # unsorted: MLX 0.32.4's CUDA gather_mm with sorted_indices=True gave wrong results for this call
        # (max error 5.4 on unit-scale outputs, float32 and bfloat16, transposed or contiguous B; H100)
        out = mx.gather_mm(x[:, None, :], w.swapaxes(-1, -2), rhs_indices=idx)
        return [out.reshape(t, n)]

    return dequant_gather


def _format(inputs: Sequence[mx.array]) -> tuple[int, int]:
    x, wq, sc = inputs[0], inputs[1], inputs[2]
    k = int(x.shape[-1])
    return 32 * int(wq.shape[-1]) // k, k // int(sc.shape[-1])


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    x, wq, sc, bi, idx = inputs
    bits, group = _format(inputs)
    e, n = int(wq.shape[0]), int(wq.shape[1])
    w = affine.reference_dequantize(wq.reshape(e * n, -1), sc.reshape(e * n, -1), bi.reshape(e * n, -1),
                                    bits, group).reshape(e, n, -1)
    # gather_mm in float32 (indexing w by every pair would hold T x N x K values: 103 GB at 16384 pairs)
    out = mx.gather_mm(x.astype(mx.float32)[:, None, :], w.swapaxes(-1, -2), rhs_indices=idx)
    return [out.reshape(x.shape[0], n)]


def builtin(inputs: Sequence[mx.array], shared_x: int = 1, sorted_pairs: bool = True) -> list[mx.array]:
    """``mx.gather_qmm`` on the pairs (:func:`make`'s decode form: x rows shared, pairs unsorted; the indices
    in any shape, read in order, as the kernels read them)."""
    x, wq, sc, bi, idx = inputs
    bits, group = _format(inputs)
    pairs = idx.size
    idx = idx if idx.ndim == 1 else idx.reshape(pairs)
    lhs = None if shared_x == 1 else mx.arange(pairs, dtype=mx.uint32) // shared_x
    out = mx.gather_qmm(x[:, None, :], wq, sc, bi, lhs_indices=lhs, rhs_indices=idx, transpose=True,
                        group_size=group, bits=bits, sorted_indices=sorted_pairs)
    return [out.reshape(pairs, -1)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    _check(shape)
    t, k, n, e, bits, group = shape
    wq, sc, bi = affine.random_weights(e * n, k, bits, group, dtype, seed, salt=1)
    idx = np.sort(rng(seed, 2).integers(0, e, size=t)).astype(np.uint32)
    return [normal((t, k), dtype, seed), wq.reshape(e, n, -1), sc.reshape(e, n, -1), bi.reshape(e, n, -1),
            mx.array(idx)]


def bytes_moved(shape: Shape, dtype: str) -> int:
    t, k, n, e, bits, group = shape
    # the experts a call reads: the expected number of distinct ones among t uniform draws (make_inputs'),
    # e.g. 7.8 of 128 at 8 pairs, 50 at 64, every one at prefill sizes
    used = round(e * (1.0 - (1.0 - 1.0 / e) ** t))
    return affine.weight_bytes(used * n, k, bits, group, dtype) + (t * k + t * n) * ITEMSIZE[dtype] + 4 * t


SPEC = KernelSpec(
    name="gather_quantized_matmul",
    description="MoE experts in MLX's affine format (pairs sorted by expert): gathered matvec, tensor cores "
                "or dequantize + gather_mm",
    dtypes=DTYPES,
    shape_doc="pairs x in x out x experts x bits x group",
    shapes={
        # Qwen3-30B-A3B's experts (hidden 2048, expert width 768, 128 experts, 8 per token)
        # 8 pairs: one token's experts; 64: a decode batch of 8
        "decode": [(8, 2048, 768, 128, 4, 64), (8, 768, 2048, 128, 4, 64),
                   (64, 2048, 768, 128, 4, 64), (64, 768, 2048, 128, 4, 64)],
        "large": [(16384, 2048, 768, 128, 4, 64), (16384, 768, 2048, 128, 4, 64),
                  (4096, 2048, 768, 128, 4, 64)],
    },
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=space,
    build=make,
    tolerances=affine.MATMUL_TOLERANCES,
    bytes_moved=bytes_moved,
    version=source_version(__file__, affine.__file__, elementwise.__file__, quantized_mma.__file__,
                           quantized_mma_source.__file__, qmk.__file__),
    validate_shape=_check,
    # (72, 128, 32, 5, 8, 32): the mma path's tiles of 16 and 32 pairs holding runs of several experts, two
    # chunks (split K, two in flight) and 32-row blocks, a last tile partial; (9, 256, 16, 3, 8, 32) and
    # (24, ...): the qmv paths alone (under 64 pairs). Not
    # 4 bits at K=256: MLX's CPU gather_qmm in bfloat16 (the built-in, checked here too) was off by 0.17-0.25
    test_shapes=[(24, 128, 16, 4, 4, 64), (9, 256, 16, 3, 8, 32), (72, 128, 32, 5, 8, 32)],
    default=default,
    prior=prior,
    config_backends=quantized_mma.config_backends,
    # x, the output, and the dq path's dense weights of every expert
    largest_tensor=lambda s: max(s[0] * s[1], s[0] * s[2], s[3] * s[2] * s[1]),
)
