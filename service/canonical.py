"""The payload digest's canonical JSON, written by orjson where its bytes are ``json.dumps``'s.

A result's payload digest is the SHA-256 of ``json.dumps(report, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` (:func:`reference_json`), and stored digests are compared on
replays, so those bytes may never change. ``json.dumps`` took 0.62 ms of a 40 KB report's result (its
1,400 floats' ``repr``; 0.035 ms with orjson), so :func:`canonical_json` writes the text with orjson
(``OPT_SORT_KEYS``) and rewrites the numbers whose spelling differs:

- orjson and ``repr`` write the same shortest digits that read back as the float; they spell the
  number differently only below 1e-4: orjson writes ``1e-7`` and ``0.00001`` where ``repr`` writes
  ``1e-07`` and ``1e-05`` (tests/service/test_canonical.py checks it on millions of doubles, every
  power of ten and its neighbours). A number's ``e-`` and one digit gets the exponent's leading zero
  (orjson's mantissa is ``repr``'s), and a number starting with ``0.0000`` is rewritten as
  ``repr(float(token))``: what ``json.dumps`` writes for that float.
- such text inside a string is left alone: a position is inside one when an odd number of quotes
  precede it, which holds when no string has an escaped quote (``\\"``); a text with one is written by
  ``json.dumps``.
- strings are escaped alike (``"``, ``\\``, ``\\b \\f \\n \\r \\t`` and ``\\u00xx`` for the other
  control characters, the rest as UTF-8), keys are sorted by code point, integers and literals are
  spelled alike. What orjson refuses (a lone surrogate, an integer over 64 bits, nesting past 255, a
  key that is not a string) is written by ``json.dumps``, which raises as before where it did.

Floats must be finite, as a validated report's are (every request model has ``allow_inf_nan=False``):
orjson writes a NaN as ``null`` where ``json.dumps`` raises.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_SHORT_EXPONENT = re.compile(rb"e-[0-9](?=[,\]}])")  # orjson's 1e-7 (repr: 1e-07)
_SMALL = re.compile(rb"0\.0000[0-9]*")  # orjson's 0.00001 (repr: 1e-05)
_DIGITS = frozenset(b"0123456789")
_BEFORE = frozenset(b",:[")  # what precedes a number in compact JSON
_AFTER = frozenset(b",]}")


def reference_json(data: Any) -> bytes:
    """The canonical form by definition: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def canonical_json(data: Any) -> bytes:
    """:func:`reference_json`'s bytes for a dict or list of finite floats, written by orjson."""
    if not isinstance(data, (dict, list)):
        return reference_json(data)
    try:
        text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return reference_json(data)
    if b'\\"' in text:
        return reference_json(data)
    found = sorted([(m.start(), m.end()) for m in _SMALL.finditer(text)]
                   + [(m.start(), 0) for m in _SHORT_EXPONENT.finditer(text)])
    if not found:
        return text
    out: list[bytes] = []
    written = counted = quotes = 0
    for at, end in found:
        quotes += text.count(b'"', counted, at)
        counted = at
        if quotes % 2:
            continue  # inside a string
        if not end:  # a number's e-D: repr writes the exponent with two digits
            out += (text[written:at + 2], b"0")
            written = at + 2
            continue
        start = at - 1 if text[at - 1] == 45 else at  # its minus sign
        if text[start - 1] in _DIGITS:
            continue  # within a larger number (10.00001), which both spell alike
        if text[start - 1] not in _BEFORE or text[end] not in _AFTER:
            return reference_json(data)  # not a number as orjson writes one: never seen
        out += (text[written:start], repr(float(text[start:end])).encode())
        written = end
    out.append(text[written:])
    return b"".join(out)
