"""What makes a campaign runnable, checked the same way by ``POST /api/v1/campaigns`` (its request
model) and by ``kernelfleet admin campaign create`` before it prints the plan (and with ``--dry-run``):
known kernels, shapes each kernel accepts (rank and dimensions), dtypes it supports, a backend that
exists and can run them, and a size bound, so a worker is never asked to allocate what no machine has.

Each problem is one phrase; the caller says where the value came from (``kernel 'rope', shape
'4096': ...`` on the server, ``--shape '4096' (kernel rope): ...`` in the CLI)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

from kernelfleet.kernels.catalog import NAMES, ZMLX_NAMES, get_spec
from kernelfleet.kernels.spec import KernelError, KernelSpec, Shape, UnknownKernel, parse_shape

DTYPES = ("float32", "float16", "bfloat16")
BACKENDS = ("metal", "cuda", "cpu")
# elements of one tensor of a job's shape: 2**30 is 4 GiB in float32 (16384 x 65536); the largest shape
# a model plan makes is a few times 10**8
MAX_SHAPE_ELEMENTS = 2**30

Prefix = Callable[..., str]


def _size(n_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n_bytes < 1024 or unit == "PiB":
            return f"{n_bytes:.3g} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.3g} PiB"


def size_problem(spec: KernelSpec, dims: Shape) -> str | None:
    elements = spec.tensor_elements(dims)
    if elements <= MAX_SHAPE_ELEMENTS:
        return None
    return (f"{elements:,} elements, above the limit of {MAX_SHAPE_ELEMENTS:,} (2**30) for one tensor "
            f"(a float32 tensor of that size alone is {_size(4 * elements)})")


def unknown_kernel(name: str) -> str:
    close = difflib.get_close_matches(name, NAMES + ZMLX_NAMES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown kernel {name!r}{hint} (`kernelfleet kernels` lists the catalog)"


def problems(kernel_shapes: dict[str, list[str]], dtypes: Sequence[str], *,
             kernel_at: Prefix = lambda kernel: "",
             shape_at: Prefix = lambda kernel, shape: f"kernel {kernel!r}, shape {shape!r}: ",
             dtype_at: Prefix = lambda dtype: "") -> list[str]:
    """Every reason the campaign's jobs could not run; empty when they all can."""
    out: list[str] = []
    for dtype in dtypes:
        if dtype not in DTYPES:
            out.append(f"{dtype_at(dtype)}unknown dtype {dtype!r}; choose {', '.join(DTYPES)}")
    for kernel, shapes in kernel_shapes.items():
        try:
            spec = get_spec(kernel)
        except UnknownKernel:
            out.append(kernel_at(kernel) + unknown_kernel(kernel))
            continue
        except KernelError as e:
            out.append(f"{kernel_at(kernel)}{e}")
            continue
        for dtype in dtypes:
            if dtype in DTYPES and dtype not in spec.dtypes:
                out.append(f"{dtype_at(dtype)}kernel {kernel!r} does not support dtype {dtype!r}; supported: "
                           f"{', '.join(spec.dtypes)}")
        for shape in shapes:
            try:
                dims = parse_shape(shape)
                spec.validate_shape(dims)
            except KernelError as e:
                out.append(f"{shape_at(kernel, shape)}{e}")
                continue
            too_big = size_problem(spec, dims)
            if too_big:
                out.append(f"{shape_at(kernel, shape)}{too_big}")
    return out


def backend_for(kernels: Sequence[str], target: str | None, chip: str | None) -> str | None:
    """The campaign's backend: kernels whose custom configs run on one backend only (zmlx's: Metal) make
    the campaign target it; ValueError when another backend is named (or none can run them all)."""
    only = {b for k in kernels if len(bs := get_spec(k).backends) == 1 for b in bs}
    if not only:
        return target
    if len(only) > 1 or (target is not None and target not in only):
        runs = ", ".join(f"{k} runs on {'/'.join(get_spec(k).backends)}" for k in kernels
                         if len(get_spec(k).backends) == 1)
        raise ValueError(f"no backend can run every kernel of this campaign ({runs}); "
                         f"target_backend {target!r} cannot")
    backend = next(iter(only))
    from kernelfleet.chips import backend_of

    if chip is not None and backend_of(chip) not in (None, backend):
        raise ValueError(f"target_chip {chip!r} is not a {backend} chip, and {', '.join(kernels)} "
                         f"run custom kernels on {backend} only")
    return backend
