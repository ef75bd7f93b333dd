from __future__ import annotations

import pytest

from kernelfleet.kernels import catalog
from kernelfleet.kernels.catalog import all_specs, get_spec
from kernelfleet.kernels.spec import BUILTIN, DTYPES, UnknownKernel


def test_unknown_kernel_lists_the_valid_names() -> None:
    with pytest.raises(UnknownKernel) as e:
        get_spec("rmsnrom")
    assert "rmsnorm" in str(e.value) and "rmsnrom" in str(e.value)


def test_every_spec_is_complete_and_consistent() -> None:
    specs = all_specs()
    assert [s.name for s in specs] == list(catalog.NAMES)
    for s in specs:
        assert set(s.dtypes) <= set(DTYPES)
        assert s.shapes["decode"] and s.shapes["large"] and s.test_shapes
        assert len(s.version) == 16
        for dtype in s.dtypes:
            assert s.tolerance(dtype).atol > 0
            for shape in [*s.shapes["decode"], *s.shapes["large"], *s.test_shapes]:
                s.validate_shape(shape)
                space = s.space(shape, dtype)
                assert space, f"{s.name} {shape} {dtype}: empty space"
                # a kernel may default to the built-in where it knows none of its configs to win
                assert s.default_config(shape, dtype) in [*space, BUILTIN]
                assert s.bytes_moved(shape, dtype) > 0
                # space axes are real axes: every config of one path has the same keys, except the
                # optional frontier axes (hint, fm, red; the mma path's gsum), which appear only away
                # from their default (0) so the original configs keep their keys. Paths may differ (a
                # gathered matmul's tensor-core path has axes its dequantize path has not, whose stored
                # keys stay)
                optional = {"hint", "fm", "red", "gsum"}
                for path in {c.get("path") for c in space}:
                    keys = {tuple(sorted(set(c) - optional)) for c in space if c.get("path") == path}
                    assert len(keys) == 1, f"{s.name} {shape} {dtype} path {path}: {keys}"
                assert all(c[k] != 0 for c in space for k in optional & set(c))


def test_inputs_are_deterministic_per_seed() -> None:
    import numpy as np

    for s in all_specs():
        shape = s.test_shapes[0]
        a = s.make_inputs(shape, s.dtypes[0], 3)
        b = s.make_inputs(shape, s.dtypes[0], 3)
        c = s.make_inputs(shape, s.dtypes[0], 4)
        assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))
        assert not all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, c, strict=True))


def test_quantized_matmuls_tensor_core_path_is_offered_to_cuda_only() -> None:
    """The mma path (CUDA's tensor cores) is in the space for every backend's planning, in a CUDA
    worker's candidates only, and refuses to build for Metal."""
    from kernelfleet.kernels.spec import KernelBuildError

    spec = get_spec("quantized_matmul")
    shape = (8, 4096, 14336, 4, 64)
    every, cuda, metal = (spec.space(shape, "bfloat16"), spec.space_for(shape, "bfloat16", "cuda"),
                          spec.space_for(shape, "bfloat16", "metal"))
    mma = [c for c in every if c["path"] == "mma"]
    assert mma and cuda == every
    assert metal == [c for c in every if c["path"] != "mma"]
    assert {c["rpw"] for c in mma} == {16, 32, 64} and {c["tg"] for c in mma} == {32, 64, 128, 256, 512}
    # 512 threads where a lane's registers hold the tiles (quantized_mma.MAX_TILES_AT_512)
    at_512 = {(c["rpw"], c["unr"]) for c in mma if c["tg"] == 512}
    assert at_512 == {(16, 1), (16, 2), (32, 1), (32, 2), (64, 1)}
    assert not [c for c in spec.space(shape, "float32") if c["path"] == "mma"]  # 16-bit operands only
    assert not [c for c in spec.space((33, 4096, 14336, 4, 64), "bfloat16") if c["path"] == "mma"]
    with pytest.raises(KernelBuildError, match="CUDA"):
        spec.build(mma[0], "metal", shape, "bfloat16")
    # the model search measures the expected fastest first: the tensor cores from M=2 where offered
    from kernelfleet.worker.search.model import prior_order

    assert prior_order(spec, shape, "bfloat16", [BUILTIN, *cuda])[1]["path"] == "mma"
    assert prior_order(spec, shape, "bfloat16", [BUILTIN, *metal])[1]["path"] == "qmv_split"
    one = (1, *shape[1:])
    first = prior_order(spec, one, "bfloat16", spec.space_for(one, "bfloat16", "cuda"))
    # one token: split K first (it won at every decode shape on the H200), qmv's typical config beside it
    assert [c["path"] for c in first[:2]] == ["qmv_split", "qmv"]
    plain = get_spec("rmsnorm")
    assert plain.space_for((32, 4096), "float16", "metal") == plain.space((32, 4096), "float16")
