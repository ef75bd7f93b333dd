"""Big bodies read off the event loop (service/bodies.py): ``loads`` gives ``json.loads``' value, type for
type, and its errors (orjson reads what it reads alike; the rest goes to ``json.loads``), so a result's
validation, messages and digest are those of ``json.loads``. Number spellings are sampled with a
rotating seed (tests/sampling.py)."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sampling import covered, full, seed

from kernelfleet.service.bodies import loads, parse_body
from kernelfleet.service.schemas import CompleteIn

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _same(raw: bytes) -> None:
    """``loads(raw)`` is ``json.loads(raw)``: equal values of the same types (repr tells 1 from 1.0 and
    -0.0 from 0.0), or the same exception."""
    try:
        expected: Any = repr(json.loads(raw))
    except Exception as e:  # noqa: BLE001 - whatever json.loads raises, loads raises
        with pytest.raises(type(e)) as got:
            loads(raw)
        assert str(got.value) == str(e)
        return
    assert repr(loads(raw)) == expected


def test_committed_reports_read_as_json_loads_reads_them() -> None:
    lines = [line.encode() for path in sorted(RESULTS.glob("*_tuning.jsonl"))
             for line in path.read_text().splitlines() if line.strip()]
    assert len(lines) >= 20
    for raw in lines:
        _same(raw)


def test_numbers_read_alike() -> None:
    rng = random.Random(seed())
    n = 400_000 if full() else 20_000
    spellings = []
    for _ in range(n):
        x = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            spellings += [repr(x), f"{x:.25g}", f"{x:.3e}".upper()]
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
        integer = digits.lstrip("0") or "0"
        spellings += [f"0.{digits}", integer, f"-{integer}.5e-{rng.randint(0, 340)}"]
    for start in range(0, len(spellings), 400):
        _same(("[" + ",".join(spellings[start:start + 400]) + "]").encode())
    print(covered("number spellings", len(spellings), len(spellings)))


@pytest.mark.parametrize("raw", [
    b"18446744073709551615", b"18446744073709551616", b'{"numel": 1180591620717411303424}',
    b"-9223372036854775809", b'{"a": "12345678901234567890", "b": 1}',
    b"[0.12345678901234567890123, 1e+1234567890123456789]",
    b"NaN", b"Infinity", b"-Infinity", b"[1e400]", b'{"a": 1, "b": 2, "a": 3}',
    b'"\\ud800"', b'"\xed\xa0\x80"',
    b'"\xff"', b"\xef\xbb\xbf{}", b"\x00", b"", b"01", b"1.", b".5", b"+1", b"[1,]", b'{"a":1,}', b"'a'",
    b'"\t"', b'["a"]x', b" \n[1]\r\n", b'"\\u00e9\\ud83d\\ude00\\/"', b"-0", b"-0.0", b'{"\\u0000": 1}',
])
def test_edges_read_or_fail_as_json_loads_does(raw: bytes) -> None:
    _same(raw)


@pytest.mark.parametrize("raw", [b"{", b'{"lease_token": "t", "report": NaN}', b"\xef\xbb\xbf[", b'"\xff"',
                                 b'{"lease_token": "t", "report": {"kernel": 1e400}}'])
def test_a_bad_body_gets_the_same_422(raw: bytes) -> None:
    """The 422's errors are those of json.loads' failure (where and why), or of validating its value."""
    with pytest.raises(RequestValidationError) as got:
        parse_body(CompleteIn, raw)
    errors = got.value.errors()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        assert [(x["loc"], x["ctx"]["error"]) for x in errors] == [(("body", e.pos), e.msg)]
    except UnicodeDecodeError as e:
        assert [(x["loc"], x["ctx"]["error"]) for x in errors] == [(("body",), str(e))]
    else:
        with pytest.raises(ValidationError) as direct:
            CompleteIn.model_validate(data)
        assert [x["loc"] for x in errors] == [("body", *x["loc"]) for x in direct.value.errors()]
        assert [x["msg"] for x in errors] == [x["msg"] for x in direct.value.errors()]
