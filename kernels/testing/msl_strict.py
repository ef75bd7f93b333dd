"""The strict MSL compile model: MLX's exact kernel text, compiled with clang ``-fsyntax-only``
against ``msl.h`` (Metal's address spaces, overload sets and bfloat rules; no C library).

Kernels are batched into translation units (each distinct header once, in a namespace of its own,
followed by its kernels) and units are compiled in parallel. Errors are attributed to the kernel
whose lines they fall in, or whose instantiation clang names in its notes.

One rewrite is guided by clang's own diagnostics (:func:`scalar_conditionals`): bfloat is a scalar
type in MSL but a class in the model, and clang keeps the address space of a class-type operand of
``?:``, so ``c ? y : T(1) - y`` (a ``thread`` bfloat lvalue and a bfloat prvalue) is refused as
"incompatible operand types ('__private metal::bfloat' and 'metal::bfloat')", where MSL, as for
every scalar, converts each operand to a prvalue first. Where clang refuses a conditional between
two bfloat operands that differ only in address space (or const), both operands are wrapped in
``kf_rvalue(...)`` (msl.h: that lvalue-to-rvalue conversion) and the unit is compiled again; every
other diagnostic stands.

An error inside msl.h (a static_assert of kf_make_vector, say) is the kernel's whose line clang's
"requested here" note names; one no kernel's instantiation names breaks every kernel of its unit.

``compile_strict(kernels)`` is the entry point (see :mod:`kernelfleet.kernels.testing`).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .mlx_metal import MetalKernel
from .msl_clang import INCLUDE_DIR, RewriteError, clang_path, for_clang, line_of
from .msl_rules import kernel_errors, signature_errors, text_errors

# C++ for OpenCL 2021 for its address spaces (see msl.h); spir64: half arithmetic (cl_khr_fp16), 64-bit
# long. No system headers at all.
CLANG_FLAGS = (
    "-x", "clcpp", "-cl-std=clc++2021", "-fsyntax-only", "--target=spir64", "-cl-no-stdinc", "-nostdinc",
    "-ferror-limit=0", "-fno-caret-diagnostics", "-Wno-unknown-attributes", "-Wno-unknown-pragmas",
    "-Werror=vla-extension", "-Werror=return-type",
    "-Werror=address-of-temporary",
    "-fdiagnostics-print-source-range-info",  # operand ranges, for scalar_conditionals
    # OpenCL 3.0's optional features Metal lacks: no double (MSL spec 2.1), program-scope variables
    # only in `constant` (MSL spec 4.2). (Metal before 4.1 has no generic address space either; a
    # pointer without an address space is refused on the text, msl_rules.py: clang 14 without the
    # generic address space refuses bfloat's own constructors.)
    "-Xclang", "-cl-ext=-cl_khr_fp64,-__opencl_c_fp64,-__opencl_c_program_scope_global_variables,"
    "-__opencl_c_device_enqueue",
)
_DIAG = re.compile(r"^(.+?):(\d+):\d+:((?:\{\d+:\d+-\d+:\d+\})*):? (error|note): (.*)$", re.MULTILINE)
_RANGE = re.compile(r"\{(\d+):(\d+)-(\d+):(\d+)\}")
# a bfloat operand in any address space, const or not: in MSL a scalar, so never incompatible with another
_BFLOAT_TYPE = r"'(?:const )?(?:__(?:private|global|local|constant) )?(?:const )?metal::bfloat'"
_BFLOAT = rf"(?:{_BFLOAT_TYPE}|'[^']*' \(aka {_BFLOAT_TYPE}\))"  # bfloat16_t is clang's sugar for it
_BFLOAT_CONDITIONAL = re.compile(rf"incompatible operand types \({_BFLOAT} and {_BFLOAT}\)")
_MAX_PASSES = 4  # a rewrite can expose an enclosing conditional: one nesting level per pass


class StrictModelUnavailable(RuntimeError):
    """No clang++ on PATH."""


@dataclass
class StrictReport:
    kernels: int = 0  # distinct kernels compiled (MLX kernel names)
    units: int = 0  # translation units
    seconds: float = 0.0  # wall time
    errors: dict[str, list[str]] = field(default_factory=dict)  # kernel name -> error lines

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self, limit: int = 20) -> str:
        head = (f"{self.kernels} kernels in {self.units} units, {len(self.errors)} with errors, "
                f"{self.seconds:.1f} s")
        lines = [f"{name}: {' | '.join(errs[:3])}" for name, errs in list(self.errors.items())[:limit]]
        return "\n".join([head, *lines])


@dataclass
class _Unit:
    text: str
    spans: list[tuple[int, int, str]]  # (first line, last line, kernel name)
    rewrite_errors: dict[str, list[str]]


def _units(kernels: Sequence[MetalKernel], per_unit: int) -> list[_Unit]:
    by_header: dict[str, list[MetalKernel]] = {}
    seen: dict[str, str] = {}
    for k in kernels:
        if k.name in seen:
            if seen[k.name] != k.text:
                raise ValueError(f"two different sources named {k.name} (MLX would mix them up)")
            continue
        seen[k.name] = k.text
        by_header.setdefault(k.header, []).append(k)
    units: list[_Unit] = []
    for h, (header, group) in enumerate(by_header.items()):
        for start in range(0, len(group), per_unit):
            chunk = group[start:start + per_unit]
            spans: list[tuple[int, int, str]] = []
            errors: dict[str, list[str]] = {}
            try:
                text = f'#include "msl.h"\nnamespace kf_header_{h} {{\n{for_clang(header, kernel=False)}\n'
            except RewriteError as e:
                units.append(_Unit("", [], {k.name: [f"header: {e}"] for k in chunk}))
                continue
            header_errors = [f"header: {e}" for e in text_errors(header)]
            for k in chunk:
                body = k.text[len(header):]
                refused = header_errors + kernel_errors(k) + signature_errors(k)
                if refused:
                    errors[k.name] = refused
                    continue
                try:
                    body = for_clang(body, limit_threadgroup_bytes=True)
                except RewriteError as e:
                    errors[k.name] = [str(e)]
                    continue
                first = line_of(text, len(text))
                text += body + "\n"
                spans.append((first, line_of(text, len(text)), k.name))
            text += "}\n"
            units.append(_Unit(text, spans, errors))
    return units


def scalar_conditionals(text: str, stderr: str) -> str | None:
    """``text`` with both operands of each conditional clang refused (in ``stderr``, compiled with
    ``-fdiagnostics-print-source-range-info``) only because two bfloat operands differ in address
    space or const wrapped in ``::kf_rvalue(...)``: the conversion to a prvalue MSL applies to the
    operands of a scalar type. Lines are kept. None when there is no such conditional."""
    data = text.encode()  # clang's columns count bytes
    starts = [0]
    starts += [i + 1 for i, ch in enumerate(data) if ch == ord("\n")]
    ranges: set[tuple[int, int]] = set()
    for m in _DIAG.finditer(stderr):
        if m.group(1) != "<stdin>" or m.group(4) != "error" or not _BFLOAT_CONDITIONAL.match(m.group(5)):
            continue
        operands = [tuple(int(g) for g in r.groups()) for r in _RANGE.finditer(m.group(3))]
        if len(operands) != 2:
            continue
        for l1, c1, l2, c2 in operands:  # 1-based lines and columns, the end one past the operand
            if max(l1, l2) <= len(starts) and (l1, c1) < (l2, c2):
                ranges.add((starts[l1 - 1] + c1 - 1, starts[l2 - 1] + c2 - 1))
    if not ranges:
        return None
    # insertions by offset: closing parentheses before opening ones, inner ranges closed first and
    # outer ones opened first, so nested operands nest
    edits = sorted([(end, 0, -start, b")") for start, end in ranges]
                   + [(start, 1, -end, b"::kf_rvalue(") for start, end in ranges])
    out: list[bytes] = []
    at = 0
    for offset, _, _, piece in edits:
        out += [data[at:offset], piece]
        at = offset
    out.append(data[at:])
    return b"".join(out).decode()


def _compile(unit: _Unit, clang: str) -> dict[str, list[str]]:
    errors = {k: list(v) for k, v in unit.rewrite_errors.items()}
    if not unit.spans:
        return errors
    text = unit.text
    for _ in range(_MAX_PASSES):
        proc = subprocess.run([clang, *CLANG_FLAGS, f"-I{INCLUDE_DIR}", "-"], input=text,
                              capture_output=True, text=True, timeout=900)
        rewritten = None if proc.returncode == 0 else scalar_conditionals(text, proc.stderr)
        if rewritten is None:
            break
        text = rewritten
    if proc.returncode == 0:
        return errors

    def owner(line: int) -> str | None:
        return next((name for first, last, name in unit.spans if first <= line <= last), None)

    current: tuple[str, list[str]] | None = None
    in_header: list[tuple[str, list[str]]] = []  # errors in msl.h: the kernels whose instantiation they name
    for m in _DIAG.finditer(proc.stderr):
        line, kind, message = int(m.group(2)), m.group(4), m.group(5)
        if m.group(1) != "<stdin>":  # in msl.h itself: in a template a kernel instantiates (its notes
            if kind == "error":      # name the kernel), or breaking every kernel of the unit
                current = (f"{m.group(1)}:{line}: {message}", [])
                in_header.append(current)
            continue
        if kind == "error":
            current = (f"line {line}: {message}", [n for n in [owner(line)] if n])
            text_line = unit.text.splitlines()[line - 1].strip() if line <= unit.text.count("\n") + 1 else ""
            errors_for = current[1] or ["<header>"]
            for name in errors_for:
                errors.setdefault(name, []).append(f"{current[0]}  [{text_line[:120]}]")
        elif current is not None and "requested here" in message:
            requester = owner(line)
            if requester and requester not in current[1]:
                current[1].append(requester)
                where = ""
                if any(current is e for e in in_header):  # the kernel's line that instantiated it
                    where = f"  [line {line}: {unit.text.splitlines()[line - 1].strip()[:120]}]"
                errors.setdefault(requester, []).append(current[0] + where)
    for message, names in in_header:
        if not names:
            errors.setdefault("<header>", []).append(message)
    if not errors:  # clang failed without a diagnostic we could read
        errors["<unit>"] = [proc.stderr[-2000:] or f"clang exited {proc.returncode}"]
    if "<header>" in errors:  # an error in a header breaks every kernel that uses it
        for _, _, name in unit.spans:
            errors.setdefault(name, []).extend(errors["<header>"])
        del errors["<header>"]
    return errors


def compile_strict(kernels: Sequence[MetalKernel], *, jobs: int | None = None,
                   per_unit: int = 400) -> StrictReport:
    """Compile every kernel (MLX's text, see :func:`.mlx_metal.metal_kernel`) against the strict
    MSL model. ``jobs`` parallel clang processes (default: CPU count)."""
    clang = clang_path()
    if clang is None:
        raise StrictModelUnavailable("clang++ is not on PATH (Debian: apt-get install clang)")
    t0 = time.perf_counter()
    units = _units(kernels, per_unit)
    report = StrictReport(kernels=len({k.name for k in kernels}), units=len(units))
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for errors in pool.map(lambda u: _compile(u, clang), units):
            for name, errs in errors.items():
                report.errors.setdefault(name, []).extend(errs)
    report.seconds = time.perf_counter() - t0
    return report
