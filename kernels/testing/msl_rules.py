"""What Metal refuses that clang's C++ for OpenCL 2021 (the strict model's language) accepts, checked
on a kernel's text and signature before clang sees it (msl_strict.py runs these; the rest of what
MSL refuses is clang's, with the optional OpenCL 3.0 features Metal lacks switched off there):

- ``long long`` and ``goto`` (MSL spec 2.1 Scalar Data Types: no ``long long``; 1.4 Metal and C++:
  no ``goto``);
- a pointer without an address space, as a function parameter or a local variable (MSL spec 4
  Address Spaces: every pointer names ``device``, ``constant``, ``threadgroup`` or ``thread``;
  clang's default ``__private`` would let a thread pointer pass unnamed);
- more than 31 buffer arguments (Metal feature set tables: 31 entries in a kernel's buffer argument
  table).

Threadgroup memory over 32 KB per kernel instantiation is checked by clang itself: msl_clang.py's
rewrite adds a ``static_assert`` over the kernel's threadgroup variables (msl.h:
``kf_threadgroup_bytes``), so template sizes count as instantiated.
"""

from __future__ import annotations

import functools
import re

from .mlx_metal import MetalKernel

MAX_BUFFERS = 31
MAX_THREADGROUP_BYTES = 32 * 1024  # msl.h's KF_MAX_THREADGROUP_BYTES: keep them equal
ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread", "threadgroup_imageblock", "ray_data",
                  "object_data")

_COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
_WORD_RULES = (
    (re.compile(r"\blong\s+long\b"),
     "`long long` is not an MSL type (MSL spec 2.1: 64-bit integers are `long`)"),
    (re.compile(r"\bgoto\b"), "`goto` is not allowed in MSL (MSL spec 1.4: Metal's C++ restrictions)"),
)
# a function definition's parameter list: `name(params) {` (parentheses inside it, e.g. attributes
# such as [[buffer(0)]] of a kernel signature MLX writes, make it no match)
_DEFINITION = re.compile(r"\b([A-Za-z_]\w*)\s*\(([^(){};]*)\)\s*(?:const\s*)?\{")
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas"}
# a local pointer declaration at the start of a statement: `T* p = ...;` / `const T<U>* p;`
_LOCAL_POINTER = re.compile(
    r"(?:^|[;{}])\s*((?:const\s+)?[A-Za-z_][\w:]*(?:\s*<[^;{}()<>]*>)?(?:\s+const)?)\s*\*+\s*(?:const\s+)?"
    r"([A-Za-z_]\w*)\s*(?==|;|\[)")
_STATEMENT_WORDS = {"return", "case", "else", "do", "delete", "throw", "co_return"}


def code_only(text: str) -> str:
    """``text`` with comments and string and character literals blanked (lines kept)."""
    return _COMMENT_OR_LITERAL.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _split_parameters(params: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        depth += {"<": 1, "(": 1, "[": 1, ">": -1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(params[start:i])
            start = i + 1
    out.append(params[start:])
    return [p.strip() for p in out if p.strip()]


def _has_address_space(declaration: str) -> bool:
    return any(w in ADDRESS_SPACES for w in re.findall(r"\w+", declaration))


def text_errors(text: str) -> list[str]:
    """MSL's rules on ``text`` (a header or a kernel's source) that clang's OpenCL mode does not check,
    as ``line N: message`` (lines of ``text``)."""
    code = code_only(text)
    errors = [f"line {_line(code, m.start())}: {message}" for rule, message in _WORD_RULES
              for m in rule.finditer(code)]
    for m in _DEFINITION.finditer(code):
        if m.group(1) in _NOT_FUNCTIONS:
            continue
        for p in _split_parameters(m.group(2)):
            if "*" in p and not _has_address_space(p):
                errors.append(f"line {_line(code, m.start(2))}: pointer parameter `{' '.join(p.split())}` of "
                              f"{m.group(1)} has no address space (MSL spec 4: device, constant, threadgroup "
                              "or thread)")
    for m in _LOCAL_POINTER.finditer(code):
        first = m.group(1).split()[0]
        if first in _STATEMENT_WORDS or _has_address_space(m.group(1)):
            continue
        errors.append(f"line {_line(code, m.start(1))}: local pointer `{m.group(2)}` (`{m.group(1)}*`) has "
                      "no address space (MSL spec 4: device, constant, threadgroup or thread)")
    return sorted(set(errors), key=lambda e: int(e.split()[1].rstrip(":")))


_INSTANTIATION_LINE = re.compile(r'\ntemplate \[\[host_name\("[^"]*"\)\]\][^\n]*\n?$')


def kernel_errors(kernel: MetalKernel) -> list[str]:
    """:func:`text_errors` of a kernel's own text (after its header): computed once per distinct
    text, up to its name and template instantiation (the configs of one kernel share it)."""
    body = kernel.text[len(kernel.header):]
    return list(_cached_text_errors(_INSTANTIATION_LINE.sub("\n", body).replace(kernel.name, "kf_kernel")))


@functools.lru_cache(maxsize=256)
def _cached_text_errors(text: str) -> tuple[str, ...]:
    return tuple(text_errors(text))


def signature_errors(kernel: MetalKernel) -> list[str]:
    """MSL's limits on a kernel's signature: its buffer arguments."""
    if len(kernel.buffers) > MAX_BUFFERS:
        return [f"{len(kernel.buffers)} buffer arguments: Metal allows {MAX_BUFFERS} per kernel (feature set "
                "tables: buffer argument table entries)"]
    return []
