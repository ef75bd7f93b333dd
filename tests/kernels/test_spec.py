from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.kernels.common import flat_rows
from kernelfleet.kernels.spec import (
    BUILTIN,
    BadShape,
    Tolerance,
    compare,
    config_key,
    format_shape,
    parse_config_key,
    parse_shape,
)


def test_parse_and_format_shape() -> None:
    assert parse_shape("4096x4096") == (4096, 4096)
    assert parse_shape("32X4096") == (32, 4096)
    assert parse_shape("16384×8192") == (16384, 8192)
    assert format_shape((1, 4096)) == "1x4096"


@pytest.mark.parametrize("text", ["", "4096x", "ax4", "0x4", "-1x4", "4.5x2"])
def test_bad_shapes_are_rejected_with_a_clear_message(text: str) -> None:
    with pytest.raises(BadShape, match="malformed shape"):
        parse_shape(text)


def test_config_keys_round_trip_and_are_canonical() -> None:
    assert config_key({"vec": 4, "tg": 256}) == "tg=256,vec=4"
    assert config_key(BUILTIN) == "builtin"
    assert parse_config_key("tg=256,vec=4") == {"tg": 256, "vec": 4}
    assert parse_config_key("builtin") == BUILTIN
    c = {"tg": 64, "vec": 2, "rpg": 4}
    assert parse_config_key(config_key(c)) == c


def test_compare_reports_errors_and_exact_outputs() -> None:
    tol = Tolerance(atol=1e-3, rtol=1e-3)
    ref = [mx.array([1.0, 2.0, 4.0])]
    ok = compare([mx.array([1.0005, 2.0, 4.0])], ref, tol)
    assert ok.ok and abs(ok.max_abs_err - 0.0005) < 1e-6
    bad = compare([mx.array([1.1, 2.0, 4.0])], ref, tol)
    assert not bad.ok and "1 of 3" in bad.detail
    nan = compare([mx.array([float("nan"), 2.0, 4.0])], ref, tol)
    assert not nan.ok
    idx_ref = [mx.array([1.0]), mx.array([3, 1], dtype=mx.uint32)]
    assert compare([mx.array([1.0]), mx.array([3, 1], dtype=mx.uint32)], idx_ref, tol, (1,)).ok
    swapped = compare([mx.array([1.0]), mx.array([1, 3], dtype=mx.uint32)], idx_ref, tol, (1,))
    assert not swapped.ok and "exact" in swapped.detail
    assert not compare([mx.array([1.0, 2.0])], ref, tol).ok  # shape mismatch


def test_compare_counts_elements_and_keeps_errors_finite() -> None:
    tol = Tolerance(1e-3, 1e-2)
    ref = [mx.array([1.0, -2.0, 0.0, 100.0])]
    ok = compare([mx.array([1.0005, -2.0, 0.0009, 100.5])], ref, tol)
    assert ok.ok and ok.detail == "" and ok.max_abs_err == pytest.approx(0.5, rel=1e-4)
    off = compare([mx.array([1.0, -2.0, 0.002, 100.0])], ref, tol)
    assert not off.ok and "1 of 4 values outside tolerance" in off.detail
    nan = compare([mx.array([1.0, float("nan"), 0.0, 100.0])], ref, tol)
    assert not nan.ok and nan.max_abs_err is None and "NaN/inf" in nan.detail
    wrong_shape = compare([mx.array([1.0, 2.0])], ref, tol)
    assert not wrong_shape.ok and wrong_shape.max_abs_err is None and "shape" in wrong_shape.detail


def test_flat_rows_views_leading_dimensions_as_rows() -> None:
    x = mx.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert flat_rows(x, 4).shape == (6, 4)
    assert flat_rows(x, 3, 4).shape == (2, 3, 4)
    assert flat_rows(mx.zeros((0, 4)), 4).shape == (0, 4)
    np.testing.assert_array_equal(np.array(flat_rows(x, 4)), np.arange(24).reshape(6, 4))
