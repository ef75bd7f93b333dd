"""Runtime dispatch: the public functions choose a config per chip and fall back to the built-in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import kernelfleet.kernels as K
from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.patch import profile_file, runtime
from kernelfleet.kernels.patch.runtime import Target
from kernelfleet.kernels.render.launch import capture, compiled_call


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path))
    runtime.clear_caches()
    yield tmp_path
    runtime.clear_caches()


def _write_profile(dir_: Path, chip: str, entries: list[dict[str, object]]) -> None:
    path = dir_ / f"{profile_file.chip_slug(chip)}.json"
    data = {"schema": profile_file.SCHEMA, "chip": chip, "version": 1, "entries": entries}
    path.write_text(json.dumps(data))


def test_cpu_falls_back_to_builtin_and_matches_reference() -> None:
    if runtime.target().backend != "cpu":
        pytest.skip("this machine has a GPU backend")
    spec = get_spec("rmsnorm")
    x, w = spec.make_inputs((8, 256), "float16", 1)
    with capture() as recs:
        out = K.rmsnorm(x, w, eps=1e-5)
    assert recs == []  # nothing custom was launched
    assert spec.compare([out], spec.reference([x, w]), "float16").ok
    assert np.array_equal(np.asarray(out), np.asarray(mx.fast.rms_norm(x, w, 1e-5)))


def _as_gpu(monkeypatch: pytest.MonkeyPatch, chip: str) -> None:
    monkeypatch.setattr(runtime, "target", lambda: Target(chip, "cuda"))


def test_default_config_is_used_without_a_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_gpu(monkeypatch, "Test GPU")
    spec = get_spec("rmsnorm")
    x, w = spec.make_inputs((32, 4096), "bfloat16", 0)
    default = spec.default_config((32, 4096), "bfloat16")
    assert runtime.choose_config("rmsnorm", (32, 4096), "bfloat16") == default
    with capture() as recs:
        K.rmsnorm(x.reshape(4, 8, 4096), w)
    assert len(recs) == 1 and recs[0].rendered.name.startswith("kf_rmsnorm_")
    assert recs[0].output_shapes == ((32, 4096),)


def test_profile_entry_selects_config_and_builtin_is_honoured(monkeypatch: pytest.MonkeyPatch,
                                                              _fresh: Path) -> None:
    chip = "Test GPU"
    _as_gpu(monkeypatch, chip)
    spec = get_spec("rmsnorm")
    x, w = spec.make_inputs((32, 4096), "float16", 0)
    chosen = {"tg": 512, "vec": 8, "rpg": 2}
    assert chosen in spec.space((32, 4096), "float16")
    _write_profile(_fresh, chip, [
        {"kernel": "rmsnorm", "shape": "32x4096", "dtype": "float16", "config": chosen, "config_key": "x"},
        {"kernel": "rmsnorm", "shape": "32x4096", "dtype": "bfloat16", "config": {"variant": "builtin"},
         "config_key": "builtin"},
    ])
    with capture() as recs:
        K.rmsnorm(x, w)
    assert len(recs) == 1
    assert dict(recs[0].launch.template)["RPG"] == 2 and recs[0].launch.threadgroup == (512, 1, 1)
    xb, wb = spec.make_inputs((32, 4096), "bfloat16", 0)
    with capture() as recs:
        out = K.rmsnorm(xb, wb)
    assert recs == []  # builtin ran (on this CPU host it computes for real)
    assert spec.compare([out], spec.reference([xb, wb]), "bfloat16").ok


def test_stale_profile_config_falls_back_to_default(monkeypatch: pytest.MonkeyPatch, _fresh: Path) -> None:
    _as_gpu(monkeypatch, "Test GPU")
    _write_profile(_fresh, "Test GPU", [{"kernel": "rmsnorm", "shape": "32x4096", "dtype": "float16",
                                         "config": {"tg": 7, "vec": 3}, "config_key": "tg=7,vec=3"}])
    spec = get_spec("rmsnorm")
    default = spec.default_config((32, 4096), "float16")
    assert runtime.choose_config("rmsnorm", (32, 4096), "float16") == default


def test_built_kernels_are_cached_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_gpu(monkeypatch, "Test GPU")
    spec = get_spec("rmsnorm")
    x, w = spec.make_inputs((4, 1024), "float32", 0)
    with capture():
        K.rmsnorm(x, w)
        K.rmsnorm(x + 1, w)
        K.rmsnorm(x, w, eps=1e-6)
    keys = list(runtime._built)
    assert len(keys) == 2
    assert all(isinstance(k, tuple) and all(not callable(p) for p in k) for k in keys)


def test_compiled_graphs_are_kept_for_the_most_recently_used_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_gpu(monkeypatch, "Test GPU")
    monkeypatch.setattr(runtime, "MAX_BUILT", 2)
    x, w = get_spec("rmsnorm").make_inputs((3, 1024), "float32", 0)
    with capture() as recs:
        for rows in (1, 2, 1, 3):
            K.rmsnorm(x[:rows], w)
    assert len(recs) == 4
    assert [k[3] for k in runtime._built] == [(1, 1024), (3, 1024)]  # (2, 1024) was least recently used


def test_compiled_call_matches_the_plain_call_and_never_traces_under_capture() -> None:
    spec = get_spec("rmsnorm")
    inputs = spec.make_inputs((4, 1024), "float32", 0)
    fn = compiled_call(spec.build(spec.default_config((4, 1024), "float32"), "cuda", (4, 1024), "float32"))
    with capture() as recs:
        fn(inputs)
        fn(inputs)
    assert len(recs) == 2  # each call ran the Python wrapper: no trace kept the captured zeros
    composed = compiled_call(lambda xs: spec.reference(xs))  # runs on this CPU host too
    for _ in range(2):  # the first call traces, the second replays
        assert mx.array_equal(composed(inputs)[0], spec.reference(inputs)[0]).item()


def _api_call(name: str, inputs: list[mx.array]) -> list[mx.array]:
    if name == "rope":
        return [K.rope(inputs[0], offset=inputs[1])]
    out = getattr(K, name)(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name", K.NAMES)
def test_every_public_function_matches_its_reference(name: str) -> None:
    spec = get_spec(name)
    shape = spec.test_shapes[0]
    inputs = spec.make_inputs(shape, "float16", 2)
    outs = _api_call(name, inputs)
    cmp = spec.compare(outs, spec.reference(inputs), "float16")
    assert cmp.ok, cmp.detail
