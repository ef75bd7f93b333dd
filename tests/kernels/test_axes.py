"""The frontier axes (issue 16) as parameter-space axes: the original configs keep their keys, an
axis at its default is left out of the config, and the new axes come only with 16-byte accesses."""

from __future__ import annotations

from kernelfleet.kernels.catalog import elementwise, get_spec, rowwise
from kernelfleet.kernels.common import ITEMSIZE


def test_elementwise_axes_extend_the_original_space() -> None:
    plain = elementwise.space(8192, "bfloat16")
    wide = elementwise.space(8192, "bfloat16", ("hint", "fm"))
    assert all(set(c) == {"tg", "vec", "ipt"} and c["ipt"] in elementwise.IPTS for c in plain)
    assert [c for c in wide if set(c) == {"tg", "vec", "ipt"} and c["ipt"] != 8] == plain
    extra = [c for c in wide if c not in plain]
    assert extra and all(c["vec"] * ITEMSIZE["bfloat16"] == 16 for c in extra)
    assert {c.get("hint", 0) for c in extra} == {0, 1, 2} and {c.get("fm", 0) for c in extra} == {0, 1}
    assert not any(c.get("hint") == 0 or c.get("fm") == 0 for c in wide)  # defaults are left out
    assert not elementwise.valid({"tg": 128, "vec": 8, "ipt": 1, "fm": 1}, 8192, "bfloat16", ("hint",))
    assert not elementwise.valid({"tg": 128, "vec": 4, "ipt": 8}, 8192, "bfloat16", ("hint", "fm"))


def test_row_axes_and_templates() -> None:
    space = rowwise.space(8192, "bfloat16", ("red",))
    assert all(c.get("hint", 0) == 0 or c["vec"] == 8 for c in space)
    assert any(c.get("red") == 1 for c in space)
    assert not any("red" in c for c in rowwise.space(8192, "bfloat16"))
    assert not rowwise.valid({"tg": 256, "vec": 8, "rpg": 1, "red": 1}, 8192, "bfloat16")  # no such axis
    launch = rowwise.row_launch({"tg": 256, "vec": 8, "rpg": 1, "hint": 2, "red": 1}, 100, 8192, "bfloat16")
    assert ("H", 2) in launch.template and ("RED", 1) in launch.template
    assert get_spec("layernorm").space((16384, 8192), "bfloat16") == space


def test_every_kernel_with_a_prior_ranks_its_whole_space() -> None:
    for name in ("swiglu", "geglu", "moe_combine", "layernorm", "rmsnorm", "softmax"):
        spec = get_spec(name)
        shape = tuple(spec.shapes["large"][0])
        assert spec.prior is not None
        costs = [spec.prior(shape, "bfloat16", c) for c in spec.space(shape, "bfloat16")]
        assert costs and all(isinstance(x, float) for x in costs)
