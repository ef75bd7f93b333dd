"""Transfers in a built profile: a chip with no result of a kernel takes another chip's measured pick
at the very shape, marked as such and scored by that pick's margin over the built-in (both databases)."""

from __future__ import annotations

from typing import Any

import pytest
from coordinator_helpers import make_report

from kernelfleet.service import aggregates, profiles
from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.models import ConfigStat
from kernelfleet.service.predict import transfer_score
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


CONFIG = "rpg=1,tg=256,vec=4"  # a config of the catalog's rmsnorm space (a transfer must be runnable)


def report(shape: str = "4096x4096", seed: int = 0) -> dict[str, Any]:
    """make_report's runs (the config 1.2x faster than the built-in) with a catalog config."""
    out = make_report(shape=shape, seed=seed)
    out["trials"][1].update(config_key=CONFIG, config={"rpg": 1, "tg": 256, "vec": 4})
    out["best_config_key"] = CONFIG
    return out


def builtin_wins(shape: str, seed: int) -> dict[str, Any]:
    """A report where the built-in (10 us) beats the only config (12.5 us)."""
    out = report(shape, seed)
    builtin, config = out["trials"][0], out["trials"][1]
    builtin.update(median_us=10.0, p10_us=9.9, p90_us=10.2, samples_us=[10.0] * 20)
    config.update(median_us=12.5, p10_us=12.5 * 0.99, p90_us=12.5 * 1.04, samples_us=[12.5] * 20)
    out["best_config_key"] = "builtin"
    return out


def test_a_chip_without_the_kernel_takes_the_other_chips_pick(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    try:
        with factory() as session, immediate(session):
            for seed in range(2):  # two runs of each
                store_report(session, TuningReport.model_validate(report(seed=seed)), source="import")
                store_report(session, TuningReport.model_validate(builtin_wins("1x4096", seed)),
                             source="import")
        with factory() as session:
            rows = aggregates.current_rows(session, ConfigStat.backend == "cuda")
            _, evidence = profiles.observations(rows)
            picks = profiles.measured_picks(evidence, "cuda")
            # the config's margin is the low end of its same-run speedup interval: per run, the built-in's
            # p10 over the config's p90 (1.19 / 1.04) with two runs
            config = picks[(H100, "rmsnorm", "4096x4096", "float16")]
            assert config.config_key == CONFIG and config.margin == pytest.approx(1.19 / 1.04)
            # the built-in's margin: the best config's slowdown, at its most favourable (p10 over p90)
            builtin = picks[(H100, "rmsnorm", "1x4096", "float16")]
            assert builtin.config_key == "builtin"
            assert builtin.margin == pytest.approx(12.5 * 0.99 / 10.2, rel=1e-6)
            body = profiles.build_body(session, H200, None, threshold=0.0, allow_predicted=True)
        assert body is not None
        entries = {e["shape"]: e for e in body["entries"]
                   if e["kernel"] == "rmsnorm" and e["dtype"] == "float16"}
        big, small = entries["4096x4096"], entries["1x4096"]
        assert big["mode"] == "transfer" and big["cross_chip"] and big["config_key"] == CONFIG
        assert big["basis"] == [{"chip": H100, "shape": "4096x4096", "weight": 1.0}]
        assert big["score"] == round(transfer_score(1.19 / 1.04), 3)
        assert big["speedup"] == round(1.19 / 1.04, 4)  # the source's margin, never above its evidence
        assert big["confidence"] == 0.5  # no calibration yet: no information
        assert small["mode"] == "transfer" and small["config_key"] == "builtin"
        assert small["fallback"] == "the built-in is predicted fastest"
    finally:
        engine.dispose()
