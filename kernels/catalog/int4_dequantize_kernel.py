"""int4 dequantization in MLX's affine layout (``mx.quantize(w, group_size=64, bits=4)``).

Shape ``rows x cols`` of the full matrix. Inputs: ``wq`` (rows x cols/8 uint32; element ``j``
is bits ``4*(j%8)..`` of word ``j/8``), ``scales`` and ``biases`` (rows x cols/64, the output
dtype). ``out[r, j] = scales[r, j/64] * code + biases[r, j/64]``. Built-in: ``mx.dequantize``.

Kernel: :data:`kernelfleet.kernels.catalog.affine.DEQUANT_BODY` (any bits and group size) at 4 bits, group 64:
elementwise geometry over packed words, ``vec`` words (8 outputs each) per step, all inside one group
(``8 % vec == 0``).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ..common import DTYPES, ITEMSIZE, TOLERANCES, mx_dtype, need_rank, rng
from ..render.dialect import source_version
from ..spec import BadShape, Config, GpuBackend, KernelFn, KernelSpec, Shape
from . import affine, elementwise

GROUP = 64
BITS = 4


def space(shape: Shape, dtype: str) -> list[Config]:
    return affine.dequant_space(shape[-1], BITS, GROUP)


def make(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
    def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
        wq, sc, bi = inputs
        out = affine.dequantize(config, backend, wq, sc, bi, BITS, GROUP)
        return [out.reshape(*wq.shape[:-1], shape[-1])]

    return fn


def reference(inputs: Sequence[mx.array]) -> list[mx.array]:
    wq, sc, bi = inputs
    return [affine.reference_dequantize(wq, sc, bi, BITS, GROUP)]


def builtin(inputs: Sequence[mx.array]) -> list[mx.array]:
    wq, sc, bi = inputs
    return [mx.dequantize(wq, sc, bi, group_size=GROUP, bits=BITS)]


def make_inputs(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
    """Packed random codes with per-group scales (~0.02) and biases (~ -8 * scale), as a quantized
    normal weight would have."""
    _check(shape)
    rows, cols = shape
    g = rng(seed, 0)
    wq = g.integers(0, 2**32, size=(rows, cols // 8), dtype=np.uint64).astype(np.uint32)
    scales = (0.01 + 0.02 * g.random((rows, cols // GROUP))).astype(np.float32)
    biases = (-8.0 * scales + 0.01 * g.standard_normal((rows, cols // GROUP))).astype(np.float32)
    dt = mx_dtype(dtype)
    return [mx.array(wq), mx.array(scales).astype(dt), mx.array(biases).astype(dt)]


def _check(shape: Shape) -> None:
    need_rank("int4_dequantize", shape, 2, "rows x cols")
    if shape[-1] % GROUP:
        raise BadShape(f"int4_dequantize: cols must be a multiple of {GROUP}, got {shape[-1]}")


SPEC = KernelSpec(
    name="int4_dequantize",
    description="MLX affine int4 dequantization, group size 64",
    dtypes=DTYPES,
    shape_doc="rows x cols",
    shapes={"decode": [(1, 4096), (32, 4096)], "large": [(8192, 8192), (14336, 4096)]},
    make_inputs=make_inputs,
    reference=reference,
    builtin=builtin,
    space=space,
    build=make,
    tolerances=TOLERANCES,
    bytes_moved=lambda shape, dtype: (shape[0] * shape[1] // 2
                                      + 2 * shape[0] * shape[1] // GROUP * ITEMSIZE[dtype]
                                      + shape[0] * shape[1] * ITEMSIZE[dtype]),
    version=source_version(__file__, affine.__file__, elementwise.__file__),
    validate_shape=_check,
    test_shapes=[(7, 192)],
    # one word per thread measured fastest on an H200 (wider steps store 64+ outputs per thread)
    default=lambda shape, dtype: {"tg": 256, "vec": 1, "ipt": 1},
)
