"""JSON columns are written by orjson (``service.db.json_dumps``) and read back as ``json.loads`` reads them,
on a real SQLite file and PostgreSQL: what orjson refuses (a lone surrogate, an integer over 64 bits) falls
back to ``json.dumps`` instead of failing the request that stores it."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import JSON, Column, Integer, MetaData, Table, insert, select

from kernelfleet.service.db import json_dumps, make_engine

VALUES: list[Any] = [
    {"samples_us": [12.5, 1e-05, 1e16, 0.1 + 0.2], "config": {"tg": 256, "vec": 4}},
    {"error": "bad input \ud800 here"},  # a lone surrogate, as a JSON escape can carry it
    {"memory_bytes": 2**70},
    {"k": np.float64(1.25), "v": [np.float32(0.5)], "a": np.arange(3)},
    {1: "int key", "caf\u00e9": None},
    [True, False, None, "unicode \u2713"],
]
READ_BACK: list[Any] = [
    VALUES[0], VALUES[1], VALUES[2], {"k": 1.25, "v": [0.5], "a": [0, 1, 2]}, {"1": "int key", "café": None},
    VALUES[5],
]


def test_json_columns_round_trip_every_value_the_service_stores(db_url: str) -> None:
    engine = make_engine(db_url)
    meta = MetaData()
    table = Table("kf_json_columns_probe", meta, Column("id", Integer, primary_key=True), Column("j", JSON))
    meta.create_all(engine)
    try:
        with engine.begin() as conn:
            conn.execute(insert(table), [{"j": v} for v in VALUES])
            stored = conn.execute(select(table.c.j).order_by(table.c.id)).scalars().all()
        assert stored == READ_BACK
    finally:
        meta.drop_all(engine)
        engine.dispose()


def test_json_dumps_is_compact_json_with_shortest_floats() -> None:
    assert json_dumps({"a": [1.5, 2], "b": "x"}) == '{"a":[1.5,2],"b":"x"}'
    assert json_dumps(2**70) == str(2**70)  # json.dumps's, exact
