"""The kernel dialect: one body, rendered by textual substitution to MSL or CUDA.

A kernel body is the inside of a GPU function written in the common subset of C++ that Metal
and CUDA share, plus:

- ``KF_*`` tokens (whole identifiers) for everything spelled differently: thread and group
  indices, barriers, shared-memory and address-space qualifiers, math functions. Each backend's
  renderer maps every token of :data:`VOCABULARY` to its spelling (``metal.TOKENS``,
  ``cuda.TOKENS``). Substitution, not ``#define``: MLX adds Metal attribute parameters
  (``thread_position_in_threadgroup`` ...) only for names it finds in the source text.
- ``kf_*`` helper functions with the same name and meaning on both backends, defined in the
  backend's prelude (vector load/store, warp and row reductions).
- ``${NAME}`` value placeholders filled at render time (e.g. ``${EPS}`` -> ``1e-05f``).
- Template parameters (``T`` the element type, ints such as ``D``, ``V``) come through MLX's
  ``template=`` argument: a template on Metal, ``constexpr``/``using`` lines on CUDA.

Conventions: ``T`` is the input/output element type, accumulation is ``float``; ``grid`` is the
total number of threads and ``threadgroup`` the group size on both backends.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Literal

from ..spec import KernelError

Backend = Literal["metal", "cuda"]

VOCABULARY: dict[str, str] = {
    # indices (x dimension; grids here are 1-D)
    "KF_TID": "thread index within its group",
    "KF_GROUP": "group index within the grid",
    "KF_GID": "thread index within the grid",
    "KF_LANE": "lane within the SIMD group / warp (0..31)",
    "KF_WARP": "SIMD group / warp index within the group",
    # synchronisation and memory
    "KF_BARRIER": "group-wide barrier that also orders shared memory",
    "KF_SHARED": "qualifier declaring a group-shared array",
    "KF_DEVICE": "address-space qualifier of global memory pointers",
    # types
    "KF_UINT": "32-bit unsigned int",
    "KF_SIZE": "64-bit unsigned index type",
    "KF_AS_FLOAT": "the float whose bits are this 32-bit unsigned int (a bit cast, no conversion)",
    # math (float in, float out)
    "KF_EXP": "e^x",
    "KF_EXP_FAST": "e^x where the backend has a faster, slightly less exact e^x (CUDA: __expf, "
                   "2 + 1.2|x| ulp: use it where |x| stays moderate or the result saturates); Metal: the "
                   "precise exp",
    "KF_LOG": "natural logarithm",
    "KF_SQRT": "square root",
    "KF_RSQRT": "1/sqrt(x)",
    "KF_TANH": "hyperbolic tangent (precise)",
    "KF_ERF": "error function",
    "KF_COS": "cosine (precise for large arguments)",
    "KF_SIN": "sine (precise for large arguments)",
    "KF_SINCOS": "KF_SINCOS(x, &s, &c): s = sin(x), c = cos(x), one range reduction where the backend has it",
    "KF_POW": "x^y",
    "KF_FMAX": "max of two floats",
    "KF_FMIN": "min of two floats",
    "KF_INF": "+infinity (float)",
}

# Helper functions every prelude must define (same name, same meaning on both backends).
HELPERS = (
    "kf_vec",        # template <typename T, int N> struct kf_vec { T v[N]; };
    "kf_vload",      # kf_vload<N>(ptr, i): elements [i*N, i*N+N) of ptr
    "kf_vstore",     # kf_vstore<N>(ptr, i, vec)
    "kf_vload_h",    # kf_vload_h<N, H>(ptr, i): kf_vload with cache-policy hint H (0 default, 1 streaming,
                     # 2 read-only path + streaming stores); Metal has no hints: plain kf_vload
    "kf_vstore_h",   # kf_vstore_h<N, H>(ptr, i, vec)
    "kf_warp_sum",   # float sum over the 32 lanes of a warp / SIMD group
    "kf_warp_max",   # float max over the warp
    "kf_shfl_xor",   # kf_shfl_xor(value, mask): value of lane ^ mask (float, int or uint)
    "kf_row_sum",    # kf_row_sum(v, shared_buf, lane, warp, warps_per_row): sum over a row's warps
    "kf_row_max",    # kf_row_max(...): max over a row's warps
    "kf_and_or",     # kf_and_or(a, mask, c): (a & mask) | c on 32-bit unsigned ints; CUDA: one LOP3
                     # with c in a register (two constants would take two instructions)
    "kf_code",       # kf_code<BITS>(word, j): code j of a packed affine word as a float, scaled by place:
                     # x * kf_code_scale<BITS>(j % (16 / BITS)) * kf_code(word, j) * kf_code_unit<BITS>()
                     # is x * code (Metal: the float magic; CUDA: two float16 subnormals an and-or)
    "kf_code_scale",
    "kf_code_unit",
)

_TOKEN_RE = re.compile(r"\bKF_\w+")
_VALUE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class DialectError(KernelError):
    """A body uses a token or placeholder the dialect does not define."""


def float_literal(value: float) -> str:
    """A C float literal that both Metal and CUDA parse: ``1e-05`` -> ``1e-05f``."""
    text = repr(float(value))
    if text in ("inf", "-inf", "nan"):
        raise DialectError(f"cannot write {value!r} as a float literal")
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


def fill_values(body: str, values: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise DialectError(f"body placeholder ${{{key}}} has no value (given: {sorted(values)})")
        return values[key]

    return _VALUE_RE.sub(sub, body)


def substitute(body: str, tokens: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok not in tokens:
            raise DialectError(f"unknown dialect token {tok}; known: {', '.join(sorted(tokens))}")
        return tokens[tok]

    return _TOKEN_RE.sub(sub, body)


def tokens_used(body: str) -> set[str]:
    return set(_TOKEN_RE.findall(body))


def render(body: str, backend: Backend, values: Mapping[str, str] | None = None) -> str:
    """Render a dialect body for ``backend`` (placeholders first, then tokens)."""
    from . import cuda as render_cuda
    from . import metal as render_metal

    tokens = render_metal.TOKENS if backend == "metal" else render_cuda.TOKENS
    if backend not in ("metal", "cuda"):
        raise DialectError(f"unknown backend {backend!r}: expected 'metal' or 'cuda'")
    return substitute(fill_values(body, values or {}), tokens)


def _written(backend: Backend) -> str:
    """The backend's prelude as its renderer writes it."""
    from . import cuda as render_cuda
    from . import metal as render_metal

    return render_metal.PRELUDE if backend == "metal" else render_cuda.PRELUDE


def _as_given(backend: Backend, text: str) -> str:
    """Prelude text as a kernel's header takes it: CUDA's compacted (:func:`~.cuda.compact`)."""
    from . import cuda as render_cuda

    return render_cuda.compact(text) if backend == "cuda" else text


@cache
def prelude(backend: Backend) -> str:
    """The backend's helper definitions, whole (CUDA's compacted): a Metal kernel's header begins with
    them, a CUDA kernel's with the part it uses (:func:`prelude_for`)."""
    return _as_given(backend, _written(backend))


_NAME_RE = re.compile(r"\bkf_\w+")
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


@cache
def _blocks(backend: Backend) -> tuple[tuple[str, frozenset[str], frozenset[str]], ...]:
    """The prelude's blank-line-separated blocks, each (its text, the ``kf_`` names it defines, the names of
    earlier blocks it uses). A name's first block in the prelude is the one that defines it: C++ and MSL
    declare before use, and the comments are left out of the search."""
    seen: set[str] = set()
    out = []
    for block in _written(backend).split("\n\n"):
        names = set(_NAME_RE.findall(_COMMENTS.sub("", block)))
        out.append((block, frozenset(names - seen), frozenset(names & seen)))
        seen |= names
    return tuple(out)


def prelude_for(backend: Backend, text: str) -> str:
    """The prelude's blocks that ``text`` (a kernel's rendered header and body) needs, with the blocks
    those need, in prelude order (CUDA's compacted); a block that defines no helper always. MLX's CUDA
    backend hashes a kernel's whole source on every launch (MLX 0.32), so what a kernel does not use is
    left out there."""
    blocks = _blocks(backend)
    want = set(_NAME_RE.findall(text))
    for _block, defines, uses in reversed(blocks):  # a block uses only earlier ones
        if defines & want:
            want |= uses
    kept = (block for block, defines, _ in blocks if not defines or defines & want)
    return _as_given(backend, "\n\n".join(kept))


_HERE = Path(__file__).resolve().parent
_DIALECT_FILES = (_HERE / "dialect.py", _HERE / "metal.py", _HERE / "cuda.py", _HERE / "launch.py",
                  _HERE.parent / "spec.py")


def source_version(*module_files: str) -> str:
    """Hash of the given kernel module files plus the dialect and renderers (16 hex chars)."""
    h = hashlib.sha256()
    paths = [Path(f).resolve() for f in module_files] + list(_DIALECT_FILES)
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]
