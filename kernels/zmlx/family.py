"""zmlx's own kernels as a kernel source in the catalog (the ``zmlx_*`` family).

Each member's custom candidates are zmlx's own function at one of zmlx's own knobs: the
threadgroup ``tg`` that ``zmlx.patch``'s modules take (32..1024, powers of two; zmlx's default is
256). Same contract as our kernels: seeded ``rows x D`` inputs, a float32 reference, the MLX
built-in as a candidate, per-dtype tolerances. The candidates come from the installed zmlx (an
optional dependency, ``pip install 'kernelfleet[zmlx]'``) and are Metal-only (``backends``), so
only Metal workers offer them and a campaign for them targets Metal.

Members (the paths ``zmlx.patch`` installs):

- ``zmlx_rmsnorm``: ``zmlx.kernels.norms.rmsnorm`` (the ``rmsnorm`` pattern's ``ZMLXRMSNorm``)
- ``zmlx_layernorm``: ``zmlx.kernels.norms.layernorm`` (``ZMLXLayerNorm``, affine)
- ``zmlx_softmax``: ``zmlx.kernels.softmax.softmax_lastdim`` (the ``softmax`` pattern)
- ``zmlx_add_rmsnorm``: ``zmlx.kernels.norms.add_rms_norm`` (the ``residual_norm`` pattern)
- ``zmlx_swiglu``, ``zmlx_geglu``: ``zmlx.kernels.transformer.swiglu2`` / ``geglu2`` (the
  ``swiglu_mlp`` / ``geglu_mlp`` patterns). These functions take no threadgroup: zmlx launches
  their kernel with ``MetalKernel``'s default (512 threads, fewer for a smaller grid). Their
  candidates launch zmlx's same kernel object at each threadgroup; the default config is zmlx's
  own choice.

The norms bake ``eps`` into the kernel name zmlx builds (``kk_rmsnorm_D{D}_TG{TG}_E{eps}``); the
family uses zmlx's defaults (1e-6 for the RMS norms, 1e-5 for layernorm).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..common import ITEMSIZE, TOLERANCES, mx_dtype, need_rank, normal
from ..spec import DTYPES, BadShape, Config, GpuBackend, KernelBuildError, KernelFn, KernelSpec, Shape

TGS = (32, 64, 128, 256, 512, 1024)
ZMLX_DEFAULT_TG = 256  # zmlx.patch.patch(threadgroup=256) and every zmlx norm's default
RMS_EPS = 1e-6  # zmlx.kernels.norms.rmsnorm / add_rms_norm default
LN_EPS = 1e-5  # zmlx.kernels.norms.layernorm default
SHAPES = {"decode": [(1, 4096), (32, 4096)], "large": [(4096, 4096), (16384, 8192)]}
TEST_SHAPES = [(3, 1000), (2, 64)]  # D not a multiple of any tg; D below most tgs
# the zmlx sources whose text decides these kernels (their version changes with any of them)
_ZMLX_FILES = ("kernels/norms.py", "kernels/softmax.py", "kernels/transformer.py", "msl.py",
               "codegen.py", "metal.py")


def zmlx_version() -> str | None:
    try:
        return metadata.version("zmlx")
    except metadata.PackageNotFoundError:
        return None


@cache
def _version() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(Path(__file__).with_name("capture.py").read_bytes())
    h.update(f"zmlx=={zmlx_version()}".encode())
    try:
        import zmlx

        root = Path(zmlx.__file__).parent
        for rel in _ZMLX_FILES:
            h.update((root / rel).read_bytes())
    except (ImportError, OSError):
        pass
    return h.hexdigest()[:16]


def _zmlx() -> Any:
    try:
        import zmlx.kernels.norms
        import zmlx.kernels.softmax
        import zmlx.kernels.transformer
    except ImportError as e:
        raise KernelBuildError("zmlx is not installed; install it with: "
                               "pip install 'kernelfleet[zmlx]'") from e
    return zmlx.kernels


def default_elementwise_tg(n: int) -> int:
    """The threadgroup zmlx's ``MetalKernel`` picks when a launch names none (grid ``n``)."""
    from .capture import import_zmlx_metal

    try:
        zm = import_zmlx_metal()
    except ImportError as e:
        raise KernelBuildError(str(e)) from e
    return int(min(zm._default_threadgroup_x(n), n)) if n > 0 else 1


# ----------------------------------------------------------------------------- members
# Each member: (inputs factory, reference, built-in, zmlx call(config, inputs) -> outputs, description).

Inputs = Callable[[Shape, str, int], list[mx.array]]
Ops = Callable[[Sequence[mx.array]], list[mx.array]]
ZmlxCall = Callable[[Any, int, Sequence[mx.array]], list[mx.array]]


def _row_inputs(n_rows: int, vectors: Sequence[tuple[float, float]]) -> Inputs:
    """``n_rows`` rows x D inputs (standard normal) and one D-vector per (loc, scale)."""

    def make(shape: Shape, dtype: str, seed: int) -> list[mx.array]:
        check_shape(shape)
        rows = [normal(shape, dtype, seed, i) for i in range(n_rows)]
        vecs = [normal(shape[-1:], dtype, seed, n_rows + i, scale=s, loc=loc)
                for i, (loc, s) in enumerate(vectors)]
        return rows + vecs

    return make


def _f32(inputs: Sequence[mx.array]) -> list[mx.array]:
    return [a.astype(mx.float32) for a in inputs]


def _rms_ref(a: Sequence[mx.array]) -> list[mx.array]:
    x, w = _f32(a)
    return [_rms(x, w, RMS_EPS)]


def _ln_ref(a: Sequence[mx.array]) -> list[mx.array]:
    x, g, b = _f32(a)
    return [_layer_norm(x, g, b, LN_EPS)]


def _add_rms_ref(a: Sequence[mx.array]) -> list[mx.array]:
    x, r, w = _f32(a)
    return [_rms(x + r, w, RMS_EPS), x + r]


def _add_rms_builtin(a: Sequence[mx.array]) -> list[mx.array]:
    h = a[0] + a[1]
    return [mx.fast.rms_norm(h, a[2], RMS_EPS), h]


def _rms(h: mx.array, w: mx.array, eps: float) -> mx.array:
    return h * mx.rsqrt(mx.mean(h * h, axis=-1, keepdims=True) + eps) * w


def _layer_norm(x: mx.array, g: mx.array, b: mx.array, eps: float) -> mx.array:
    mean = mx.mean(x, axis=-1, keepdims=True)
    var = mx.mean(mx.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * mx.rsqrt(var + eps) * g + b


def _gelu_tanh(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + mx.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


_swiglu_builtin = mx.compile(lambda g, u: _silu(g) * u)
_geglu_builtin = mx.compile(lambda g, u: _gelu_tanh(g) * u)


def _gated_call(kernel_of: str) -> ZmlxCall:
    def call(zk: Any, tg: int, inputs: Sequence[mx.array]) -> list[mx.array]:
        g, u = inputs
        kernel = getattr(zk.transformer, kernel_of)()
        return list(kernel(g, u, template=[("T", g.dtype)], grid=(g.size, 1, 1), threadgroup=(tg, 1, 1),
                           output_shapes=[g.shape], output_dtypes=[g.dtype]))

    return call


_MEMBERS: dict[str, tuple[str, Inputs, Ops, Ops, ZmlxCall, int]] = {
    # name: (description, inputs, reference, built-in, zmlx call, row-sized arrays moved)
    "zmlx_rmsnorm": (
        "zmlx.kernels.norms.rmsnorm (eps=1e-6), zmlx.patch's ZMLXRMSNorm",
        _row_inputs(1, [(1.0, 0.5)]),
        _rms_ref,
        lambda a: [mx.fast.rms_norm(a[0], a[1], RMS_EPS)],
        lambda zk, tg, a: [zk.norms.rmsnorm(a[0], a[1], eps=RMS_EPS, threadgroup=tg)],
        2,
    ),
    "zmlx_layernorm": (
        "zmlx.kernels.norms.layernorm (eps=1e-5), zmlx.patch's ZMLXLayerNorm",
        _row_inputs(1, [(1.0, 0.5), (0.0, 0.5)]),
        _ln_ref,
        lambda a: [mx.fast.layer_norm(a[0], a[1], a[2], LN_EPS)],
        lambda zk, tg, a: [zk.norms.layernorm(a[0], a[1], a[2], eps=LN_EPS, threadgroup=tg)],
        2,
    ),
    "zmlx_softmax": (
        "zmlx.kernels.softmax.softmax_lastdim, zmlx.patch's softmax pattern",
        _row_inputs(1, []),
        lambda a: [mx.softmax(a[0].astype(mx.float32), axis=-1)],
        lambda a: [mx.softmax(a[0], axis=-1)],
        lambda zk, tg, a: [zk.softmax.softmax_lastdim(a[0], threadgroup=tg)],
        2,
    ),
    "zmlx_add_rmsnorm": (
        "zmlx.kernels.norms.add_rms_norm (eps=1e-6): (rmsnorm(x + r) * w, x + r), zmlx.patch's residual_norm",
        _row_inputs(2, [(1.0, 0.5)]),
        _add_rms_ref,
        _add_rms_builtin,
        lambda zk, tg, a: list(zk.norms.add_rms_norm(a[0], a[1], a[2], eps=RMS_EPS, threadgroup=tg)),
        4,
    ),
    "zmlx_swiglu": (
        "zmlx.kernels.transformer.swiglu2: silu(gate) * up, zmlx.patch's swiglu_mlp",
        _row_inputs(2, []),
        lambda a: [_silu(a[0].astype(mx.float32)) * a[1].astype(mx.float32)],
        lambda a: [_swiglu_builtin(a[0], a[1])],
        _gated_call("_swiglu2_fwd_kernel"),
        3,
    ),
    "zmlx_geglu": (
        "zmlx.kernels.transformer.geglu2: gelu_tanh(gate) * up, zmlx.patch's geglu_mlp",
        _row_inputs(2, []),
        lambda a: [_gelu_tanh(a[0].astype(mx.float32)) * a[1].astype(mx.float32)],
        lambda a: [_geglu_builtin(a[0], a[1])],
        _gated_call("_geglu2_fwd_kernel"),
        3,
    ),
}
NAMES: tuple[str, ...] = tuple(_MEMBERS)
GATED = ("zmlx_swiglu", "zmlx_geglu")  # zmlx's function takes no threadgroup (MetalKernel's default)


def check_shape(shape: Shape) -> None:
    need_rank("zmlx kernels", shape, 2, "rows x D")
    if shape[-1] < 1:
        raise BadShape("zmlx kernels: D must be positive")


def space(shape: Shape, dtype: str) -> list[Config]:
    """zmlx's threadgroups. Without zmlx installed there is nothing to offer, and this raises: a Metal
    worker that lacks zmlx then fails the job (it is retried elsewhere) instead of reporting a result
    in which the built-in won because every zmlx candidate failed to build."""
    _zmlx()
    return [{"tg": tg} for tg in TGS]


def default_config(name: str, shape: Shape) -> Config:
    """zmlx's own choice: tg 256 for the norms and softmax, MetalKernel's default for swiglu/geglu."""
    if name in GATED:
        return {"tg": default_elementwise_tg(shape[0] * shape[1])}
    return {"tg": ZMLX_DEFAULT_TG}


def make(name: str) -> Callable[[Config, GpuBackend, Shape, str], KernelFn]:
    call = _MEMBERS[name][4]

    def build(config: Config, backend: GpuBackend, shape: Shape, dtype: str) -> KernelFn:
        if backend != "metal":
            raise KernelBuildError(f"{name}: zmlx's kernels run on Metal only, not {backend}")
        tg = int(config["tg"])
        if tg not in TGS:
            raise KernelBuildError(f"{name}: tg must be one of {TGS}, got {tg}")
        mx_dtype(dtype)
        zk = _zmlx()

        def fn(inputs: Sequence[mx.array]) -> list[mx.array]:
            return call(zk, tg, inputs)

        return fn

    return build


@cache
def spec(name: str) -> KernelSpec:
    description, inputs, reference, builtin, _, moved = _MEMBERS[name]
    return KernelSpec(
        name=name,
        description=description,
        dtypes=DTYPES,
        shape_doc="rows x D",
        shapes=SHAPES,
        make_inputs=inputs,
        reference=reference,
        builtin=builtin,
        space=space,
        build=make(name),
        tolerances=TOLERANCES,
        bytes_moved=lambda shape, dtype: moved * shape[0] * shape[1] * ITEMSIZE[dtype],
        version=_version(),
        validate_shape=check_shape,
        test_shapes=TEST_SHAPES,
        default=lambda shape, dtype: default_config(name, shape),
        backends=("metal",),
    )
