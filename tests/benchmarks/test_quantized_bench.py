"""benchmarks/quantized.py's config selection: ``--paths`` and ``--where`` pick the configs a run (timed or
under ``--ncu``) takes from the spec's space, an optional axis a config lacks reading as 0."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quantized  # noqa: E402

from kernelfleet.kernels.catalog import get_spec  # noqa: E402


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"configs": "all", "paths": None, "where": None, **kw})


def test_where_picks_axis_values() -> None:
    spec = get_spec("quantized_matmul")
    shape = (1, 4096, 14336, 4, 64)
    every = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args(paths="qmv_split"))
    picked = quantized.our_configs(spec, shape, "bfloat16", "cuda",
                                   _args(paths="qmv_split", where="rpw=8,vw=4,tg=64|128"))
    assert picked == [c for c in every if c["rpw"] == 8 and c["vw"] == 4 and c["tg"] in (64, 128)]
    assert {c["tg"] for c in picked} == {64, 128}


def test_where_reads_an_optional_axis_a_config_lacks_as_zero() -> None:
    """swiglu's frontier axes (hint, fm) appear only away from 0: hint=0 is the configs without it."""
    spec = get_spec("swiglu")
    shape = spec.shapes["large"][0]
    every = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args())
    plain = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args(where="hint=0"))
    hinted = quantized.our_configs(spec, shape, "bfloat16", "cuda", _args(where="hint=1"))
    assert plain == [c for c in every if "hint" not in c] and plain
    assert hinted == [c for c in every if c.get("hint") == 1] and hinted
    assert len(plain) + len(hinted) <= len(every)


@pytest.mark.parametrize("bad", ["rpw", "=4", "rpw=", "rpw=4,,vw=4"])
def test_where_refuses_what_is_not_axis_equals_values(bad: str) -> None:
    with pytest.raises(SystemExit, match="--where"):
        quantized.parse_where(bad)
