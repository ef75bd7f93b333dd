"""The catalog's zmlx source (``kernels.zmlx_family``): zmlx's own functions at zmlx's threadgroups,
the same spec contract as our kernels, Metal-only, and their launches captured off a Mac."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernelfleet.kernels.catalog import NAMES, ZMLX_NAMES, get_spec
from kernelfleet.kernels.spec import BUILTIN, DTYPES, KernelBuildError, UnknownKernel, config_key
from kernelfleet.kernels.zmlx.capture import capture
from kernelfleet.kernels.zmlx.family import GATED, TGS
from kernelfleet.worker.backends.cpu import CpuBackend
from kernelfleet.worker.backends.cuda import CudaBackend
from kernelfleet.worker.backends.metal import MetalBackend


def test_the_family_is_in_the_catalog_beside_ours() -> None:
    assert set(ZMLX_NAMES) == {"zmlx_rmsnorm", "zmlx_layernorm", "zmlx_softmax", "zmlx_add_rmsnorm",
                               "zmlx_swiglu", "zmlx_geglu"}
    assert not set(ZMLX_NAMES) & set(NAMES)
    with pytest.raises(UnknownKernel, match="zmlx_rmsnorm"):
        get_spec("zmlx_nope")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ZMLX_NAMES)
def test_builtin_matches_the_float32_reference(name: str, dtype: str) -> None:
    spec = get_spec(name)
    for shape in spec.test_shapes:
        inputs = spec.make_inputs(shape, dtype, 0)
        assert all(a.dtype == getattr(mx, dtype) for a in inputs)
        cmp = spec.compare(spec.builtin(inputs), spec.reference(inputs), dtype)
        assert cmp.ok, f"{name} {shape} {dtype}: {cmp.detail}"
        again = spec.make_inputs(shape, dtype, 0)
        assert all(mx.array_equal(a, b) for a, b in zip(inputs, again, strict=True))  # seeded


@pytest.mark.parametrize("name", ZMLX_NAMES)
def test_candidates_are_zmlx_s_own_launches_at_each_threadgroup(name: str) -> None:
    """Captured off a Mac: each config makes exactly one launch of zmlx's kernel at that threadgroup."""
    spec = get_spec(name)
    for rows, d in spec.test_shapes:
        inputs = spec.make_inputs((rows, d), "float16", 0)
        assert [c["tg"] for c in spec.space((rows, d), "float16")] == list(TGS)
        for config in spec.space((rows, d), "float16"):
            with capture() as records:
                outs = spec.build(config, "metal", (rows, d), "float16")(inputs)
            [rec] = records
            tg = config["tg"]
            assert rec.threadgroup == (tg, 1, 1)
            assert [tuple(o.shape) for o in outs] == list(rec.output_shapes)
            assert rec.template == (("T", mx.float16),)
            if name in GATED:
                assert rec.name in ("kk_swiglu2_fwd", "kk_geglu2_fwd") and rec.grid == (rows * d, 1, 1)
            else:
                assert f"_D{d}_TG{tg}" in rec.name and rec.grid == (rows * tg, 1, 1)
    # zmlx's default: 256 for the norms and softmax, MetalKernel's own pick for swiglu/geglu
    assert spec.default_config((1, 4096), "float16") == {"tg": 512 if name in GATED else 256}


def test_only_metal_offers_them() -> None:
    spec = get_spec("zmlx_rmsnorm")
    assert spec.backends == ("metal",)
    shape = (32, 4096)
    assert CudaBackend().candidates(spec, shape, "float16") == [BUILTIN]
    assert CpuBackend().candidates(spec, shape, "float16") == [BUILTIN]
    metal = [config_key(c) for c in MetalBackend().candidates(spec, shape, "float16")]
    assert metal == ["builtin"] + [f"tg={t}" for t in TGS]
    assert len(CudaBackend().candidates(get_spec("rmsnorm"), shape, "float16")) > 1  # ours still are
    with pytest.raises(KernelBuildError, match="Metal only"):
        spec.build({"tg": 256}, "cuda", shape, "float16")


@pytest.mark.metal
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ZMLX_NAMES)
def test_every_candidate_matches_the_reference_on_metal(name: str, dtype: str) -> None:
    if not mx.metal.is_available():
        pytest.skip("MLX Metal backend not available on this machine")
    spec = get_spec(name)
    runner = MetalBackend()
    failures = []
    for shape in spec.test_shapes:
        inputs = spec.make_inputs(shape, dtype, 0)
        ref = spec.reference(inputs)
        for config in [BUILTIN, *spec.space(shape, dtype)]:
            outs = runner.build(spec, config, shape, dtype)(inputs)
            cmp = spec.compare(outs, ref, dtype)
            if not cmp.ok:
                failures.append(f"{shape} {config_key(config)}: {cmp.detail}")
    assert not failures, "\n".join(failures)


def test_without_zmlx_a_metal_worker_offers_nothing_and_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Metal worker without zmlx must not report the built-in as the winner of a zmlx job: the
    candidates raise (the agent reports the job failed) and name the extra to install."""
    import sys

    monkeypatch.setitem(sys.modules, "zmlx.kernels.norms", None)  # import fails as if not installed
    spec = get_spec("zmlx_rmsnorm")
    with pytest.raises(KernelBuildError, match=r"pip install 'kernelfleet\[zmlx\]'"):
        MetalBackend().candidates(spec, (1, 4096), "float16")
    assert CpuBackend().candidates(spec, (1, 4096), "float16") == [BUILTIN]  # CPU runs the built-in only


def test_the_metal_emulator_backend_offers_them() -> None:
    from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

    offered = MetalEmuBackend().candidates(get_spec("zmlx_softmax"), (4, 128), "float32")
    assert [config_key(c) for c in offered] == ["builtin"] + [f"tg={t}" for t in TGS]
