"""gather_quantized_matmul's qmv paths (the decode form of mixture-of-experts projections): each pair's
blocks read its expert's index and its own row of x. Checked on the Metal emulator (the dialect's other
rendering of the same body) against the float32 reference, with pairs in any order, and with planted
mutants (every pair on one expert, every pair on x's first row) that the same check must catch."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from kernelfleet.kernels.catalog import affine
from kernelfleet.kernels.catalog import gather_quantized_matmul_kernel as gqm
from kernelfleet.kernels.catalog import quantized_matmul_kernel as qmk
from kernelfleet.kernels.render.launch import capture, intercept, run
from kernelfleet.kernels.spec import BadShape, KernelBuildError
from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

K, N, E = 512, 16, 6  # K 512: 2 steps of a row at vw 1, so qmv_split's 2 warps each take one
CONFIGS = [
    {"path": "qmv", "rpw": 2, "vw": 1, "tg": 64, "unr": 1},
    {"path": "qmv", "rpw": 4, "vw": 2, "tg": 64, "unr": 1},
    {"path": "qmv_split", "rpw": 2, "vw": 1, "tg": 64, "unr": 1},  # 2 warps meet in shared memory
]


def _inputs(pairs: int, dtype: str, order: list[int]) -> list[mx.array]:
    """The spec's inputs at ``pairs`` x K x N x E, 4 bits, group 32, with the experts ``order`` (as a decode
    step routes them: unsorted, some repeated)."""
    x, wq, sc, bi, _ = gqm.make_inputs((pairs, K, N, E, 4, 32), dtype, 5)
    x = (x * (1.0 + mx.arange(pairs)[:, None])).astype(x.dtype)  # every pair's row its own scale
    return [x, wq, sc, bi, mx.array(np.array(order, dtype=np.uint32))]


def _close(got: mx.array, want: mx.array, dtype: str) -> bool:
    tol = affine.MATMUL_TOLERANCES[dtype]
    g32, w32 = got.astype(mx.float32), want.astype(mx.float32)
    return bool(mx.all(mx.abs(g32 - w32) <= tol.atol + tol.rtol * mx.abs(w32)).item())


ORDERS = {"eight pairs": [4, 1, 5, 0, 3, 2, 1, 4], "uneven": [5, 5, 0, 2, 5, 1, 0, 3, 4, 2, 1]}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c['path']}-rpw{c['rpw']}-vw{c['vw']}")
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_each_pair_runs_its_own_expert_on_its_own_row(order: str, config: dict[str, int], dtype: str,
                                                       emu: MetalEmuBackend) -> None:
    experts = ORDERS[order]
    shape = (len(experts), K, N, E, 4, 32)
    inputs = _inputs(len(experts), dtype, experts)
    assert config in gqm.space(shape, dtype)
    with capture() as launches:
        gqm.make(config, "metal", shape, dtype)(inputs)
    assert len(launches) == 1
    with intercept(emu.launch):
        got = gqm.make(config, "metal", shape, dtype)(inputs)[0]
        mx.eval(got)
    assert got.shape == (len(experts), N)
    assert _close(got, gqm.reference(inputs)[0], dtype)


# planted bugs the check above must catch: every pair on expert 0's weights; every pair on x's first row
MUTANTS = {"one expert": ("ROW", "(n0 + r)"), "one row of x": ("XROW", "KF_SIZE(0)")}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_planted_bug_fails_the_check(mutant: str, emu: MetalEmuBackend) -> None:
    key, value = MUTANTS[mutant]
    source = replace(qmk.GATHER_QMV_SOURCE,
                     values=tuple((k, value if k == key else v) for k, v in qmk.GATHER_QMV_SOURCE.values))
    experts = ORDERS["uneven"]
    inputs = _inputs(len(experts), "float32", experts)
    launch = qmk.gather_qmv_launch(CONFIGS[0], len(experts), K, N, 4, 32, "float32")
    with intercept(emu.launch):
        good = run(qmk.GATHER_QMV_SOURCE, "metal", inputs, launch, [(len(experts), N)], [mx.float32])[0]
        bad = run(source, "metal", inputs, launch, [(len(experts), N)], [mx.float32])[0]
        mx.eval(good, bad)
    want = gqm.reference(inputs)[0]
    assert _close(good, want, "float32")
    assert not _close(bad, want, "float32")


def test_the_space_follows_mlx_lms_sort() -> None:
    """Under 64 pairs mlx-lm leaves them in the router's order: the qmv paths alone. From 64 (sorted) the
    tensor cores and dequantize + gather_mm too; past a decode batch of 8 tokens (64 pairs) each pair
    reading its expert would reread experts, so the qmv paths stop."""
    def paths(t: int) -> set[str]:
        return {str(c["path"]) for c in gqm.space((t, 2048, 768, 128, 4, 64), "bfloat16")}
    assert paths(8) == paths(63) == {"qmv", "qmv_split"}
    assert paths(64) == {"qmv", "qmv_split", "mma", "dq"}
    assert paths(65) == {"mma", "dq"}


def test_bytes_count_the_experts_a_call_reads() -> None:
    """One token's 8 pairs read about 8 of 128 experts, prefill's 16,384 every one."""
    one = gqm.bytes_moved((8, 2048, 768, 128, 4, 64), "bfloat16")
    expert = affine.weight_bytes(768, 2048, 4, 64, "bfloat16")
    assert 7 * expert < one < 9 * expert
    assert gqm.bytes_moved((16384, 2048, 768, 128, 4, 64), "bfloat16") > 128 * expert


@pytest.mark.parametrize("config", CONFIGS[::2], ids=lambda c: c["path"])
def test_a_tokens_experts_share_its_row(config: dict[str, int], emu: MetalEmuBackend) -> None:
    """The decode form of up and gate (``shared_x``): two tokens' 4 experts each, x one row a token, the
    pairs in the router's order; the kernel and the built-in both match the reference on x repeated."""
    experts = [3, 0, 5, 1, 1, 4, 2, 0]
    shape = (len(experts), K, N, E, 4, 32)
    inputs = _inputs(len(experts), "float32", experts)
    tokens = inputs[0][::4]  # rows 0 and 4: one a token
    want = gqm.reference([mx.repeat(tokens, 4, axis=0), *inputs[1:]])[0]
    shared = [tokens, *inputs[1:]]
    with intercept(emu.launch):
        got = gqm.make(config, "metal", shape, "float32", shared_x=4, sorted_pairs=False)(shared)[0]
        mx.eval(got)
    assert _close(got, want, "float32")
    assert _close(gqm.builtin(shared, shared_x=4, sorted_pairs=False)[0], want, "float32")


def test_sorted_paths_refuse_the_decode_form() -> None:
    """The tensor cores' and dequantize's paths take sorted pairs, a row of x each."""
    dq = next(c for c in gqm.space((64, K, N, E, 4, 32), "float32") if c["path"] == "dq")
    with pytest.raises(KernelBuildError, match="sorted pairs"):
        gqm.make(dq, "metal", (64, K, N, E, 4, 32), "float32", sorted_pairs=False)
    with pytest.raises(BadShape, match="share x rows"):
        gqm.make(CONFIGS[0], "metal", (8, K, N, E, 4, 32), "float32", shared_x=3)
