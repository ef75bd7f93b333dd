"""The payload digest's canonical JSON (service/canonical.py): orjson's text, rewritten where it spells a
number otherwise, is ``json.dumps``'s to the byte, so stored payload digests keep matching replays. The
float sweep is sampled with a rotating seed (tests/sampling.py); a result stored over the API carries the
digest of the reference form and is replayed by it, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll, lease, make_report
from sampling import covered, full, seed
from sqlalchemy import select

from kernelfleet.service.canonical import canonical_json, reference_json
from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Result
from kernelfleet.service.schemas import TuningReport

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _doubles(rng: random.Random, n: int) -> list[float]:
    """Random bit patterns (every exponent), log-uniform magnitudes, integral and rounded decimals,
    and every power of ten with its two neighbours."""
    out = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 2.0**53, 2.0**53 + 2]
    for e in range(-323, 309):
        x = float(f"1e{e}")
        out += [x, math.nextafter(x, math.inf), math.nextafter(x, 0.0)]
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            x = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        elif kind == 1:
            x = 10 ** rng.uniform(-30, 30)
        elif kind == 2:
            x = float(rng.randint(0, 10**18))
        else:
            x = round(rng.uniform(0, 1) * 10 ** rng.randint(-12, 17), rng.randint(0, 20))
        out.append(x if rng.random() < 0.5 else -x)
    return [x for x in out if math.isfinite(x)]


def test_floats_are_written_as_json_dumps_writes_them() -> None:
    rng = random.Random(seed())
    doubles = _doubles(rng, 2_000_000 if full() else 40_000)
    for start in range(0, len(doubles), 500):
        chunk = doubles[start:start + 500]
        data = {"xs": chunk, "by": {f"k{i}": x for i, x in enumerate(chunk[:50])}, "one": chunk[0]}
        assert canonical_json(data) == reference_json(data), chunk
    print(covered("doubles", len(doubles), len(doubles)))


@pytest.mark.parametrize("text", ["1e-7]", "x:0.00001,", "[3e-05,", "0.00001", "a\\b e-5}", "\u00e9 e-5]"])
def test_number_like_text_in_strings_is_left_alone(text: str) -> None:
    for data in ({"s": text, "v": 1e-7}, {text: 3e-05, "w": [text, 0.00002]}, [text, {"e-5]": 1e-9}]):
        assert canonical_json(data) == reference_json(data)


def test_strings_and_keys_are_escaped_and_sorted_alike() -> None:
    chars = [chr(c) for c in [*range(0x300), 0x2028, 0x2029, 0xFEFF, 0xFFFF, 0x4E2D, 0x1F600, 0x10FFFF]]
    data = {c: c * 3 for c in chars}
    assert canonical_json(data) == reference_json(data)
    rng = random.Random(seed())
    for _ in range(200):
        keys = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 4))) for _ in range(6)]
        row = {k: [rng.random() * 1e-5, k[::-1]] for k in keys}
        assert canonical_json(row) == reference_json(row)
    quoted = {"error": 'expected "}" at 1e-5]', "v": 3e-07}  # an escaped quote: written by json.dumps
    assert canonical_json(quoted) == reference_json(quoted)


@pytest.mark.parametrize("data", [{"numel": 2**64}, {"seed": -2**63 - 1}, {"n": 2**63}, {1: 2.5e-7},
                                  {"t": (1, 2e-8)}, [[[]]], {}, []])
def test_what_orjson_refuses_or_spells_otherwise_is_json_dumps_text(data: Any) -> None:
    assert canonical_json(data) == reference_json(data)


def test_what_json_dumps_refuses_is_refused() -> None:
    for data in ({"s": "\ud800"}, {"\udfff": 1}):
        with pytest.raises(UnicodeEncodeError):
            reference_json(data)
        with pytest.raises(UnicodeEncodeError):
            canonical_json(data)
    deep: Any = 1e-7
    for _ in range(300):  # past orjson's nesting limit
        deep = [deep]
    assert canonical_json(deep) == reference_json(deep)


def test_committed_reports_digest_as_before() -> None:
    reports = [json.loads(line) for path in sorted(RESULTS.glob("*_tuning.jsonl"))
               for line in path.read_text().splitlines() if line.strip()]
    assert len(reports) >= 20
    rewritten = 0
    for raw in reports:
        report = TuningReport.model_validate(raw)
        dumped = report.model_dump(mode="json", exclude={"revision"} if report.revision is None else None)
        assert report.digest() == hashlib.sha256(reference_json(dumped)).hexdigest()
        rewritten += orjson.dumps(dumped, option=orjson.OPT_SORT_KEYS) != reference_json(dumped)
    assert rewritten >= len(reports) // 5  # floats below 1e-4, spelled otherwise by orjson (180 of 648)


def test_a_result_is_stored_and_replayed_by_the_reference_digest(coordinator: Coordinator) -> None:
    """The digest a result is stored with is the reference form's (json.dumps, as results stored
    before canonical.py were), so a replay of one matches and a changed payload is still refused."""
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    report = make_report()
    report["trials"][1].update(max_abs_err=3.0517578125e-05, max_rel_err=1.2e-07)
    report["trials"][2]["error"] = 'nvcc: "x" at 1e-5] and 0.00001,'
    report["golden"].update(sample=[1e-7, -4.5e-06, 0.00012, 1e22], numel=2**70)  # 2**70: read by json.loads
    with coordinator.client(token) as c:
        got = lease(c)
        assert got is not None
        body = {"lease_token": got["lease_token"], "report": report}
        url = f"/jobs/{got['job_id']}/result"
        first = c.post(url, json=body)
        assert first.status_code == 201, first.text
        replay = c.post(url, json=body)
        assert replay.status_code == 200 and replay.json() == first.json()
        changed = json.loads(json.dumps(body))
        changed["report"]["trials"][1]["max_rel_err"] = 1.3e-07
        assert c.post(url, json=changed).status_code == 422
    dumped = TuningReport.model_validate(report).model_dump(mode="json", exclude={"revision"})
    expected = hashlib.sha256(reference_json(dumped)).hexdigest()
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            stored = conn.execute(select(Result.payload_digest, Result.golden)).one()
    finally:
        engine.dispose()
    assert stored.payload_digest == expected
    assert stored.golden["numel"] == 2**70
