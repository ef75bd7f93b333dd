"""``kernelfleet pull`` end to end: results posted through the real API (enrolled worker, campaign,
leases, reports), the CLI run as a user runs it, the pulled profile used by the kernels runtime,
the zmlx cache read back by the real ``zmlx.autotune.load_autotune_cache``; and the edge cases
(unreachable coordinator, corrupt cache)."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from kernelfleet.kernels.catalog import ZMLX_NAMES, all_specs, get_spec
from kernelfleet.kernels.patch import profile_file
from kernelfleet.kernels.render.launch import capture
from kernelfleet.kernels.spec import BUILTIN, config_key, format_shape
from kernelfleet.worker.zmlx_cache import launch_entries, zmlx_entries

M3_MAX = "Apple M3 Max"


def kf(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "kernelfleet.worker.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def report(
    chip: str, backend: str, shape: str, best_factor: float, rng: np.random.Generator,
    kernel: str = "rmsnorm", best: int | None = None,
) -> dict[str, Any]:
    """An exhaustive report over the kernel's real config space at ``shape``: config i runs at
    ``100 * (1 + 0.05 i)`` us except config ``best`` (default ``len // 2``), which runs at
    ``100 * best_factor``."""
    spec = get_spec(kernel)
    rows, cols = (int(d) for d in shape.split("x"))
    configs = spec.space((rows, cols), "float16")
    trials = []
    for i, c in enumerate(configs):
        center = 100.0 * (best_factor if i == (len(configs) // 2 if best is None else best) else 1 + 0.05 * i)
        samples = center * np.exp(rng.normal(0, 0.01, 20))
        trials.append(
            {
                "config_key": config_key(c),
                "config": c,
                "is_builtin": False,
                "status": "ok",
                "samples_us": [float(v) for v in samples],
                "median_us": float(np.median(samples)),
                "p10_us": float(np.percentile(samples, 10)),
                "p90_us": float(np.percentile(samples, 90)),
                "n": 20,
                "max_abs_err": 0.0,
                "max_rel_err": 0.0,
            }
        )
    trials.append(
        {
            "config_key": "builtin",
            "config": {"variant": "builtin"},
            "is_builtin": True,
            "status": "ok",
            "samples_us": None,
            "median_us": 150.0,
            "p10_us": 149.0,
            "p90_us": 151.0,
            "n": 2000,
            "max_abs_err": 0.0,
            "max_rel_err": 0.0,
        }
    )
    best = min(trials, key=lambda t: t["median_us"])["config_key"]
    return {
        "kernel": kernel,
        "shape": shape,
        "dtype": "float16",
        "seed": 0,
        "strategy": "exhaustive",
        "env": {
            "chip": chip,
            "backend": backend,
            "mlx_version": "0.32.4",
            "os": "macOS 15.1",
            "kernel_hash": spec.version,
        },
        "trials": trials,
        "best_config_key": best,
        "golden": {
            "digest": "a" * 64,
            "stats": {"mean": 0, "std": 1, "min": -1, "max": 1, "abs_mean": 0.5},
            "sample": [0.0],
            "stride": 1,
            "numel": rows * cols,
        },
    }


def post_through_leases(
    coordinator: Any,
    chip: str,
    backend: str,
    shapes: list[str],
    rng: np.random.Generator,
    best_factor: float = 0.5,
    kernels: tuple[str, ...] = ("rmsnorm",),
    best: int | None = None,
) -> None:
    """Enroll a worker for ``chip``, create a campaign for ``kernels`` x ``shapes``, lease every job and
    post its report; return once the coordinator's background work has built the profile from them."""
    with coordinator.admin() as admin:
        enroll = admin.post("/enroll-tokens", json={}).json()["token"]
        r = admin.post(
            "/campaigns",
            json={
                "name": f"tune {chip}",
                "kernels": list(kernels),
                "shapes": shapes,
                "dtypes": ["float16"],
                "target_chip": chip,
            },
        )
        assert r.status_code == 201, r.text
    with coordinator.client() as anon:
        w = anon.post(
            "/workers/enroll",
            json={
                "enrollment_token": enroll,
                "name": chip,
                "chip": chip,
                "backend": backend,
                "os": "macOS 15.1",
                "mlx_version": "0.32.4",
            },
        )
        assert w.status_code == 201, w.text
    with coordinator.client(w.json()["token"]) as worker:
        for _ in range(len(shapes) * len(kernels)):
            lease = worker.post("/leases", json={})
            assert lease.status_code == 200, lease.text
            job = lease.json()
            body = {
                "lease_token": job["lease_token"],
                "report": report(chip, backend, job["shape"], best_factor, rng, job["kernel"], best),
            }
            assert worker.post(f"/jobs/{job['job_id']}/result", json=body).status_code == 201
        assert worker.post("/leases", json={}).status_code == 204
    # the chip's profile is rebuilt in the background after each result: without this a pull could
    # get a version built from the first results only (a fresh-clone run pulled 2 of the 4 entries)
    coordinator.settle(profiles=True)


def as_mac(monkeypatch: pytest.MonkeyPatch, brand: str) -> None:
    """Make zmlx's real ``detect_device`` see an Apple-silicon Mac whose CPU brand string is ``brand``
    (it reads ``platform`` and ``sysctl machdep.cpu.brand_string``); the ``mac_cache`` fixture drops
    its cached answer afterwards."""
    import zmlx.device as zd

    monkeypatch.setattr(zd.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(zd.platform, "machine", lambda: "arm64")
    memsize = str(64 << 30)
    monkeypatch.setattr(zd, "_sysctl", lambda key: brand if key == "machdep.cpu.brand_string" else memsize)
    zd.detect_device.cache_clear()


@pytest.fixture(autouse=True)
def mac_cache() -> Iterator[None]:
    yield
    import zmlx.device as zd

    zd.detect_device.cache_clear()


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"KERNELFLEET_PROFILE_DIR": str(tmp_path / "profiles"), "ZMLX_CACHE_DIR": str(tmp_path / "zmlx")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_pull_installs_profile_and_zmlx_reads_it(
    coordinator_factory: Any, dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # every prediction that beats the built-in is used (no confidence threshold): this test is about
    # installing; the threshold has its own test below
    coordinator = coordinator_factory(KERNELFLEET_PREDICTION_MIN_CONFIDENCE="0")
    rng = np.random.default_rng(0)
    post_through_leases(coordinator, M3_MAX, "metal", ["4096x4096", "1024x4096"], rng)
    post_through_leases(coordinator, "Apple M3 Pro", "metal", ["2048x4096"], rng)  # never tuned on the Max
    cache = Path(dirs["ZMLX_CACHE_DIR"]) / "autotune_v3.json"
    cache.parent.mkdir(parents=True)
    other = {
        "M1_0.30.0": {
            "metadata": {"family": "M1"},
            "entries": {"k": {"tg": [64, 1, 1], "template": []}},
            "saved_at": "2025-01-01T00:00:00",
        }
    }
    cache.write_text(json.dumps({"schema_version": "3.0", "devices": other}))

    done = kf("pull", "--coordinator", coordinator.url, "--chip", M3_MAX, "--mlx-version", "0.32.4", env=dirs)
    assert done.returncode == 0, done.stderr
    assert "M3_0.32.4" in done.stdout  # zmlx's key on an M3 Max (test_zmlx_device_key_is_zmlx_s_own)

    # KernelFleet's own profile file: tuned entries and the predicted one, read by lookup()
    body = json.loads(profile_file.profile_path(M3_MAX).read_text())
    # version 1 was built from the Max's runs, a later one once the Pro's run changed the predictions
    assert body["schema"] == profile_file.SCHEMA and body["chip"] == M3_MAX and body["version"] >= 1
    tuned_shapes = sorted(e["shape"] for e in body["entries"] if not e["predicted"])
    predicted_shapes = sorted(e["shape"] for e in body["entries"] if e["predicted"])
    assert tuned_shapes == ["1024x4096", "4096x4096"]
    # the M3 Pro's shape and the catalog's standard shapes the Max never ran
    assert "2048x4096" in predicted_shapes and "32x4096" in predicted_shapes
    assert f"{len(body['entries'])} entries ({len(predicted_shapes)} predicted" in done.stdout
    configs = get_spec("rmsnorm").space((4096, 4096), "float16")
    expected_best = config_key(configs[len(configs) // 2])
    tuned = profile_file.lookup("rmsnorm", "4096x4096", "float16", M3_MAX)
    assert tuned is not None and tuned["predicted"] is False and tuned["config_key"] == expected_best
    assert tuned["speedup"] == pytest.approx(150.0 / tuned["median_us"], rel=1e-4)  # both rounded
    predicted = profile_file.lookup("rmsnorm", "2048x4096", "float16", M3_MAX)
    assert predicted is not None and predicted["predicted"] is True
    assert predicted["config_key"] == expected_best  # what the nearby shapes and the M3 Pro agree on

    # zmlx's cache: other devices kept, and the real zmlx loader finds every entry for the device key
    data = json.loads(cache.read_text())
    assert data["schema_version"] == "3.0" and data["devices"]["M1_0.30.0"] == other["M1_0.30.0"]
    ours = data["devices"]["M3_0.32.4"]
    customs = [e for e in body["entries"] if e["config_key"] != "builtin"]
    assert len(ours["entries"]) == len(customs) >= 4 and ours["metadata"]["chip"] == M3_MAX

    import zmlx.autotune as za

    as_mac(monkeypatch, M3_MAX)
    za.GLOBAL_AUTOTUNE_CACHE.clear()
    assert za._device_cache_key() == "M3_0.32.4"
    assert za.load_autotune_cache() == len(ours["entries"])
    assert len(za.GLOBAL_AUTOTUNE_CACHE) == len(customs)
    tg = int(tuned["config"]["tg"])
    key = next(k for k in za.GLOBAL_AUTOTUNE_CACHE if k.input_shapes == ((4096, 4096), (4096,)))
    assert za.GLOBAL_AUTOTUNE_CACHE[key].threadgroup == (tg, 1, 1)
    assert key.input_dtypes == ("mlx.core.float16", "mlx.core.float16") and key.kernel_name.startswith(
        "kf_rmsnorm"
    )

    # pulling again: the coordinator answers 304 to the installed ETag
    again = kf(
        "pull", "--coordinator", coordinator.url, "--chip", M3_MAX, "--mlx-version", "0.32.4", env=dirs
    )
    assert again.returncode == 0, again.stderr
    assert f"version {body['version']} unchanged" in again.stdout


def test_pull_auto_feeds_the_kernels_runtime(coordinator: Any, dirs: dict[str, str]) -> None:
    from kernelfleet.chips import detect_chip
    from kernelfleet.kernels.patch import runtime

    chip = detect_chip().name
    rng = np.random.default_rng(1)
    # this Linux host's chip runs MLX's CPU backend: its reports carry custom configs that measured
    # faster, but CPU runs no custom kernels, so its profile holds only built-ins and no predictions
    post_through_leases(coordinator, chip, "cpu", ["4096x4096", "1024x4096"], rng)
    done = kf("pull", "--coordinator", coordinator.url, env=dirs)
    assert done.returncode == 0, done.stderr
    assert "zmlx cache: skipped" in done.stdout and "not an Apple chip" in done.stdout
    body = json.loads(profile_file.profile_path(chip).read_text())
    assert body["backend"] == "cpu" and len(body["entries"]) == 2
    assert all(e["config"] == {"variant": "builtin"} and not e["predicted"] for e in body["entries"])
    runtime.clear_caches()
    entry = profile_file.lookup("rmsnorm", "4096x4096", "float16", chip)
    assert entry is not None and entry["runs"] == 1 and entry["workers"] == 1
    assert runtime.choose_config("rmsnorm", (4096, 4096), "float16") == {"variant": "builtin"}
    assert profile_file.lookup("rmsnorm", "32x4096", "float16", chip) is None


def test_unreachable_coordinator_leaves_files_untouched(dirs: dict[str, str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile = profile_file.profile_path(M3_MAX)
    profile.parent.mkdir(parents=True)
    profile.write_text(
        json.dumps(
            {
                "schema": profile_file.SCHEMA,
                "chip": M3_MAX,
                "mlx_version": None,
                "version": 3,
                "etag": "e",
                "entries": [],
            }
        )
    )
    cache = Path(dirs["ZMLX_CACHE_DIR"]) / "autotune_v3.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"schema_version": "3.0", "devices": {}}))
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (profile, cache)}
    done = kf("pull", "--coordinator", f"http://127.0.0.1:{port}", "--chip", M3_MAX, env=dirs)
    assert done.returncode == 1
    assert (
        "cannot reach the coordinator at http://127.0.0.1:" in done.stderr and "Traceback" not in done.stderr
    )
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (profile, cache)} == before
    assert sorted(x.name for x in cache.parent.iterdir()) == ["autotune_v3.json"]


def test_corrupt_zmlx_cache_is_kept_as_backup(coordinator: Any, dirs: dict[str, str]) -> None:
    rng = np.random.default_rng(2)
    post_through_leases(coordinator, M3_MAX, "metal", ["4096x4096"], rng)
    cache = Path(dirs["ZMLX_CACHE_DIR"]) / "autotune_v3.json"
    cache.parent.mkdir(parents=True)
    cache.write_text('{"schema_version": "3.0", "devices": {truncated')
    done = kf("pull", "--coordinator", coordinator.url, "--chip", M3_MAX, "--mlx-version", "0.32.4", env=dirs)
    assert done.returncode == 0, done.stderr
    [backup] = list(cache.parent.glob("autotune_v3.json.corrupt-*"))
    assert backup.read_text() == '{"schema_version": "3.0", "devices": {truncated'
    assert "kept it as" in done.stderr
    data = json.loads(cache.read_text())
    assert list(data["devices"]) == ["M3_0.32.4"]
    entries = data["devices"]["M3_0.32.4"]["entries"]
    assert any(json.loads(k)["shapes"] == [[4096, 4096], [4096]] for k in entries)


def test_unknown_chip_gets_a_clear_error(coordinator: Any, dirs: dict[str, str]) -> None:
    done = kf("pull", "--coordinator", coordinator.url, "--chip", "Apple M9 Ultra", env=dirs)
    assert done.returncode == 1
    assert "no measured results for chip 'Apple M9 Ultra'" in done.stderr and "Traceback" not in done.stderr
    assert not Path(dirs["KERNELFLEET_PROFILE_DIR"]).exists()
    with httpx.Client() as c:
        assert c.get(coordinator.url + "/api/v1/profiles").json() == []



@pytest.mark.parametrize("kernel", [s.name for s in all_specs()])
def test_zmlx_entries_from_shape_only_inputs_match_real_inputs(kernel: str) -> None:
    """Pull captures each config's launch on shape-only placeholder inputs (no data generated); the
    entries are exactly those the seeded inputs give."""
    spec = get_spec(kernel)
    module = importlib.import_module(f"kernelfleet.kernels.catalog.{kernel}_kernel")
    for kind in ("decode", "large"):
        full = tuple(spec.shapes[kind][0])
        shape = (min(full[0], 64), *full[1:])  # seeded inputs of a large shape take seconds to make
        config = spec.default_config(shape, "float16")
        if config == BUILTIN:  # MLX's op by default (quantized matmul at 8 < M < 256): our first config
            config = dict(spec.space(shape, "float16")[0])
        with capture() as records:
            module.make(config, "metal", shape, "float16")(spec.make_inputs(shape, "float16", 0))
        expected = {
            json.dumps({"name": r.rendered.name, "shapes": [list(x) for x in r.input_shapes],
                        "dtypes": [str(d) for d in r.input_dtypes], "grid": list(r.launch.grid),
                        "t_params": [["tuning", "templates"]]}): list(r.launch.threadgroup)
            for r in records
        }
        entries = launch_entries(kernel, format_shape(shape), "float16", config)
        assert {k: v["tg"] for k, v in entries.items()} == expected


def test_pull_for_a_chip_without_data_refuses_unless_predicted_allowed(
    coordinator_factory: Any, dirs: dict[str, str]
) -> None:
    """Apple M4 Max never ran anything: pull exits non-zero naming the closest chips with data and
    touches no file; --allow-predicted installs predicted entries, marked, and zmlx receives only
    those at or above the confidence threshold."""
    coordinator = coordinator_factory(KERNELFLEET_PREDICTION_MIN_CONFIDENCE="0.55")
    rng = np.random.default_rng(3)
    post_through_leases(coordinator, M3_MAX, "metal", ["4096x4096", "1024x4096", "2048x4096"], rng)
    post_through_leases(coordinator, "Apple M3 Pro", "metal", ["4096x4096", "8192x4096"], rng)
    coordinator.profile(M3_MAX)
    cache = Path(dirs["ZMLX_CACHE_DIR"]) / "autotune_v3.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"schema_version": "3.0", "devices": {}}))
    before = cache.read_bytes()
    target = "Apple M4 Max"
    refused = kf("pull", "--coordinator", coordinator.url, "--chip", target, env=dirs)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "no measured results for chip 'Apple M4 Max'" in refused.stderr
    assert M3_MAX in refused.stderr and "--allow-predicted" in refused.stderr
    assert not profile_file.profile_path(target).exists() and cache.read_bytes() == before

    done = kf("pull", "--coordinator", coordinator.url, "--chip", target, "--allow-predicted", env=dirs)
    assert done.returncode == 0, done.stderr
    body = json.loads(profile_file.profile_path(target).read_text())
    assert body["entries"] and all(e["predicted"] for e in body["entries"])
    assert all({b["chip"] for b in e["basis"]} <= {M3_MAX, "Apple M3 Pro"} for e in body["entries"])
    trusted = [e for e in body["entries"] if "fallback" not in e and e["config_key"] != "builtin"]
    assert all(e["confidence"] >= 0.55 for e in trusted)
    low = [e for e in body["entries"] if "fallback" in e]
    assert all(e["config_key"] == "builtin" for e in low)
    # the summary says how many fell back to the built-in, and why
    reasons = Counter("confidence below 0.55" if e["fallback"].startswith("confidence") else e["fallback"]
                      for e in low)
    assert low and reasons
    why = ", ".join(f"{n} {r}" for r, n in reasons.most_common())
    assert f"({len(body['entries'])} predicted; {len(low)} of them the built-in: {why})" in done.stdout
    ours = json.loads(cache.read_text())["devices"]["M4_0.32.4"]["entries"]
    assert len(ours) == len(trusted)


def test_zmlx_device_key_is_zmlx_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """For every Apple chip of the chip table, the key pull writes is the key zmlx's own
    ``_device_cache_key`` computes on a Mac with that CPU brand string (zmlx 0.10 stops at the first
    of its chip names the brand contains, so "Apple M3 Max" gets "M3"). A chip zmlx does not know
    gets zmlx's "Unknown"."""
    import mlx.core as mx
    import zmlx.autotune as za

    from kernelfleet.chips import TABLE
    from kernelfleet.worker.zmlx_cache import device_key

    apple = [row.name for row in TABLE if row.backend == "metal"]
    assert len(apple) == 15
    for brand in [*apple, "Apple M5 Pro"]:
        as_mac(monkeypatch, brand)
        assert device_key(brand, mx.__version__) == za._device_cache_key(), brand
    assert device_key("Apple M3 Max", "0.32.4") == "M3_0.32.4"
    assert device_key("Apple M5 Pro", "0.32.4") == "Unknown_0.32.4"


def test_zmlx_get_autotuned_config_returns_the_pulled_config(
    coordinator: Any, dirs: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Metal worker tunes zmlx's rmsnorm and ours on an M3 Max; `kernelfleet pull` writes zmlx's own
    keys for zmlx's kernel beside ours; zmlx loads the file and its own ``get_autotuned_config``, with
    the timing function replaced by one that fails if called, returns the pulled threadgroup."""
    import mlx.core as mx
    import zmlx.autotune as za
    from zmlx.kernels import norms

    from kernelfleet.kernels.zmlx.family import RMS_EPS

    shapes = ["1x4096", "32x4096"]
    post_through_leases(coordinator, M3_MAX, "metal", shapes, np.random.default_rng(5),
                        kernels=("zmlx_rmsnorm", "rmsnorm"), best=2)  # zmlx_rmsnorm: tg=128, not zmlx's 256
    done = kf("pull", "--coordinator", coordinator.url, "--chip", M3_MAX, "--mlx-version", "0.32.4", env=dirs)
    assert done.returncode == 0, done.stderr
    assert "entries under M3_0.32.4" in done.stdout and "2 for zmlx's own kernels" in done.stdout

    body = json.loads(profile_file.profile_path(M3_MAX).read_text())
    tuned = {e["shape"]: e for e in body["entries"] if e["kernel"] == "zmlx_rmsnorm" and not e["predicted"]}
    assert sorted(tuned) == shapes
    expected_tg = int(get_spec("zmlx_rmsnorm").space((1, 4096), "float16")[2]["tg"])
    assert expected_tg == 128
    assert {e["config"]["tg"] for e in tuned.values()} == {expected_tg}
    entries = json.loads((Path(dirs["ZMLX_CACHE_DIR"]) / "autotune_v3.json").read_text())[
        "devices"]["M3_0.32.4"]["entries"]
    names = sorted(json.loads(k)["name"] for k in entries)
    assert [n for n in names if n.startswith("kk_")] == [f"kk_rmsnorm_D4096_TG{expected_tg}_E1e_06"] * 2
    assert any(n.startswith("kf_rmsnorm") for n in names)  # ours, keyed by our own launches

    as_mac(monkeypatch, M3_MAX)
    za.GLOBAL_AUTOTUNE_CACHE.clear()
    za._FAST_CACHE.clear()
    assert za.load_autotune_cache() == len(entries)

    def no_timing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("zmlx timed candidates in-process instead of using the pulled config")

    monkeypatch.setattr(za, "autotune_kernel", no_timing)
    for shape in shapes:
        rows, d = (int(v) for v in shape.split("x"))
        kernel = norms._rmsnorm_kernel(d, expected_tg, RMS_EPS)  # the object zmlx's rmsnorm launches
        x, w = mx.zeros((rows, d), dtype=mx.float16), mx.zeros((d,), dtype=mx.float16)
        config = za.get_autotuned_config(kernel, inputs=[x, w], grid=(rows * expected_tg, 1, 1),
                                         threadgroup_candidates=[(t, 1, 1) for t in (32, 64, 128, 256)])
        assert config == za.AutotuneConfig(threadgroup=(expected_tg, 1, 1), template=())
    with pytest.raises(AssertionError, match="timed candidates"):  # an untuned shape would be timed
        za.get_autotuned_config(kernel, inputs=[mx.zeros((7, d), dtype=mx.float16), w],
                                grid=(7 * expected_tg, 1, 1))

    # the same pull feeds kernelfleet.zmlx.patch: a Llama of hidden size 4096 (weights never evaluated)
    monkeypatch.undo()  # this host is no Mac again (and the dirs fixture's variables are set again)
    for k, v in dirs.items():
        monkeypatch.setenv(k, v)
    za.GLOBAL_AUTOTUNE_CACHE.clear()
    za._FAST_CACHE.clear()
    llama = pytest.importorskip("mlx_lm.models.llama", reason="mlx-lm is not installed")
    from zmlx.patch._modules import ZMLXRMSNorm

    from kernelfleet.zmlx import patch

    model = llama.Model(llama.ModelArgs(model_type="llama", hidden_size=4096, num_hidden_layers=1,
                                        intermediate_size=64, num_attention_heads=32, num_key_value_heads=8,
                                        rms_norm_eps=1e-6, vocab_size=8))
    model.set_dtype(mx.float16)
    pinned = patch(model, profile=M3_MAX, patterns=["rmsnorm"])
    norms_ = [m for _, m in model.named_modules() if isinstance(m, ZMLXRMSNorm)]
    assert len(norms_) == 3 and all(n._resolved_tg == expected_tg for n in norms_)
    assert {p.basis for p in pinned.pinned} == {"measured (1 runs, 1 workers) at 1x4096"}


@pytest.mark.parametrize("kernel", ZMLX_NAMES)
def test_zmlx_entries_are_what_zmlx_itself_saves(
    kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For each zmlx kernel and threadgroup, the entry pull writes equals the one zmlx's own
    ``save_autotune_cache`` writes after its own ``get_autotuned_config`` chose that threadgroup for the
    launch zmlx's function makes (its search stubbed to answer it); shape-only inputs give the same."""
    import zmlx.autotune as za

    from kernelfleet.kernels.zmlx.capture import capture

    spec = get_spec(kernel)
    shape = (5, 1000)
    for config in spec.space(shape, "bfloat16"):
        ours = zmlx_entries(kernel, format_shape(shape), "bfloat16", config)
        with capture() as records:
            spec.build(config, "metal", shape, "bfloat16")(spec.make_inputs(shape, "bfloat16", 0))
        [rec] = records
        chosen = za.AutotuneConfig(threadgroup=rec.threadgroup, template=())
        monkeypatch.setattr(za, "autotune_kernel", lambda *a, c=chosen, **k: za.AutotuneResult(c, {c: 1.0}))
        za.GLOBAL_AUTOTUNE_CACHE.clear()
        za._FAST_CACHE.clear()
        inputs = spec.make_inputs(shape, "bfloat16", 0)
        assert za.get_autotuned_config(rec.kernel, inputs=inputs, grid=rec.grid) == chosen
        path = tmp_path / f"{kernel}-{config['tg']}.json"
        za.save_autotune_cache(str(path))
        [section] = json.loads(path.read_text())["devices"].values()
        assert ours == section["entries"], config
