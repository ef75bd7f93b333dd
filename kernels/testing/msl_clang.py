"""Turning MLX's Metal kernel text into C++ clang accepts, for the strict model and the emulator.

Three spellings MSL allows and clang (C++) does not, rewritten and nothing else:

- the explicit instantiation MLX appends, ``template [[host_name("k")]] [[kernel]] decltype(k<..>)
  k<..>;``: clang accepts no attribute list there, so they are dropped;
- a ``threadgroup`` variable declared in a kernel body (``threadgroup float red[32];``): clang
  rejects address-space-qualified automatic variables, so it becomes a reference to threadgroup
  memory, ``threadgroup float (&red)[32] = kf_threadgroup_memory<float[32]>();`` (declared in
  msl.h; the emulator's runtime gives each threadgroup its own).

- a vector constructor, ``float4(a, b, c, d)``, ``half4(v)``, ``bfloat4(v)``: clang's vectors
  (ext_vector_type) and the model's class vectors (bfloat; half in the emulator) have none of MSL's
  (a list of scalars and vectors, a splat, an element-wise conversion: MSL spec 2.4, 2.12), so it
  becomes ``kf_make_vector<float4>(a, b, c, d)`` (msl.h), which builds each the way MSL does and
  refuses what MSL refuses. Declarations (``float4 f(``) and conversion functions are left alone.

MSL rules the rewrite itself checks: a threadgroup variable has no initializer and is declared in a
function body (never at program scope), one per declaration.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
INCLUDE_DIR = HERE  # msl.h, emu_runtime.h and the <metal_stdlib> shim live beside this file

_INSTANTIATION = re.compile(r'template\s*\[\[host_name\("[^"]*"\)\]\]\s*\[\[kernel\]\]\s*decltype')
_TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|[{};]|\bthreadgroup\b', re.DOTALL)
_DECL = re.compile(r"threadgroup\s+(?P<type>[\w:<>, ]+?)\s+(?P<name>\w+)\s*(?P<dims>(?:\[[^\[\];]+\]\s*)*)$",
                   re.DOTALL)


# `T<n>(` (or `vec<T, n>(`) of an MSL vector type the model defines (msl.h), not `T<n>()`, not a
# member or another namespace's name (`v.float4(`, `ns::float4(`; `metal::float4(` is MSL's own)
VECTOR_TYPES = ("float", "half", "bfloat", "int", "uint", "short", "ushort", "char", "uchar")
_VECTOR_CONSTRUCTOR = re.compile(
    rf"(?<![\w.:])(?<!->)(?P<type>(?:metal\s*::\s*)?(?:(?:{'|'.join(VECTOR_TYPES)})[234]|vec\s*<[^<>(){{}};]*>))"
    r"(?P<space>\s*)\((?!\s*\))")
_OPERATOR = re.compile(r"\boperator\s*$")


class RewriteError(ValueError):
    """Source the rewrite refuses because MSL refuses it too (reported like a compile error)."""


@dataclass(frozen=True)
class Declaration:
    start: int  # offset of `threadgroup`
    end: int  # offset just past the `;`
    type: str
    name: str
    dims: str


def clang_path() -> str | None:
    return shutil.which("clang++")


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def threadgroup_declarations(text: str, kernel: bool = True) -> list[Declaration]:
    """The statement-level ``threadgroup`` variable declarations of ``text`` (pointer parameters and
    casts are not statements and are left alone). ``kernel``: whether ``text`` is a kernel function
    (MSL allows threadgroup variables only there, not in the helpers of a header)."""
    out: list[Declaration] = []
    depth = 0
    last_end = 0  # end of the previous `{`, `}`, `;` or comment: a declaration starts a statement
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if tok.startswith('"'):
            continue
        if tok.startswith(("//", "/*")) or tok in "{};":
            depth += {"{": 1, "}": -1}.get(tok, 0)
            last_end = m.end()
            continue
        between = text[last_end:m.start()].splitlines()
        if any(ln.strip() and not ln.strip().startswith("#") for ln in between):
            continue
        end = text.find(";", m.end())
        stmt = text[m.start():end]
        if end < 0 or "(" in stmt or "{" in stmt:
            continue  # a parameter, a cast or a function declaration, not a variable
        line = line_of(text, m.start())
        if depth == 0 or not kernel:
            raise RewriteError(f"line {line}: threadgroup variable outside a kernel function (MSL allows "
                               "them only in a kernel function's body)")
        if "=" in stmt:
            raise RewriteError(f"line {line}: threadgroup variables cannot have initializers: {stmt.strip()}")
        d = _DECL.match(stmt.strip())
        if d is None or "," in d.group("dims"):
            raise RewriteError(f"line {line}: cannot read threadgroup declaration {stmt.strip()!r} "
                               "(one variable per declaration: `threadgroup T name[N];`)")
        out.append(Declaration(m.start(), end + 1, d.group("type").strip(), d.group("name"),
                               # each size in parentheses: inside kf_threadgroup_memory<T[...]>, a size
                               # such as `KS > 1 ? A : B` would otherwise end the template's arguments
                               re.sub(r"\[([^\]]*)\]", r"[(\1)]", re.sub(r"\s+", "", d.group("dims")))))
    return out


def vector_constructors(text: str) -> str:
    """``text`` with each MSL vector constructor call ``T<n>(...)`` (or ``vec<T, n>(...)``) spelled
    ``kf_make_vector<T<n>>(...)`` (msl.h); lines are kept. A conversion function (``operator
    float4()``) is left alone."""

    def call(m: re.Match[str]) -> str:
        if _OPERATOR.search(text, max(0, m.start() - 40), m.start()):
            return m.group(0)
        return f"kf_make_vector<{m.group('type')}>{m.group('space')}("

    return _VECTOR_CONSTRUCTOR.sub(call, text)


def for_clang(text: str, kernel: bool = True, limit_threadgroup_bytes: bool = False) -> str:
    """``text`` (MLX's kernel source, any number of kernels; ``kernel=False`` for a header of
    helpers) rewritten for clang; line numbers are kept, so diagnostics point at the original lines.
    ``limit_threadgroup_bytes`` (``text`` one kernel): after its last threadgroup variable, a
    ``static_assert`` that all of them fit Metal's 32 KB (msl.h), checked per instantiation."""
    text = vector_constructors(_INSTANTIATION.sub("template decltype", text))
    parts: list[str] = []
    at = 0
    declarations = threadgroup_declarations(text, kernel)
    for d in declarations:
        parts.append(text[at:d.start])
        parts.append(f"threadgroup {d.type} (&{d.name}){d.dims} = kf_threadgroup_memory<{d.type}{d.dims}>();")
        if limit_threadgroup_bytes and d is declarations[-1]:
            types = ", ".join(f"{x.type}{x.dims}" for x in declarations)
            parts.append(f" static_assert(kf_threadgroup_bytes<{types}>() <= KF_MAX_THREADGROUP_BYTES, "
                         '"threadgroup memory over 32 KB (Metal: maxThreadgroupMemoryLength 32768)");')
        parts.append("\n" * text.count("\n", d.start, d.end))
        at = d.end
    parts.append(text[at:])
    return "".join(parts)
