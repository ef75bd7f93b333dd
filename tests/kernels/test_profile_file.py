"""KernelFleet's profile file: atomic write, read, lookup (mtime-keyed reload), bad bodies refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelfleet.kernels.patch import profile_file


def body(chip: str, config_key: str, version: int = 1) -> dict[str, object]:
    return {
        "schema": profile_file.SCHEMA,
        "chip": chip,
        "mlx_version": None,
        "version": version,
        "etag": "e",
        "entries": [
            {
                "kernel": "rmsnorm",
                "shape": "4096x4096",
                "dtype": "float16",
                "config_key": config_key,
                "config": {"tg": int(config_key.split("=")[1])},
                "median_us": 40.0,
                "speedup": 1.5,
                "predicted": version > 1,
            }
        ],
    }


def test_write_read_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path))
    chip = "Apple M3 Max"
    assert profile_file.lookup("rmsnorm", "4096x4096", "float16", chip) is None
    path = profile_file.write(body(chip, "tg=256"))
    assert path == tmp_path / "Apple_M3_Max.json" and profile_file.read(chip)["version"] == 1
    assert profile_file.lookup("rmsnorm", "4096x4096", "float16", chip)["config"] == {"tg": 256}
    assert profile_file.lookup("rmsnorm", "1x4096", "float16", chip) is None
    # a new version replaces the file atomically; lookup sees it (no stale cache) and no temp file is left
    profile_file.write(body(chip, "tg=512", version=2))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    entry = profile_file.lookup("rmsnorm", "4096x4096", "float16", chip)
    assert entry is not None and entry["config"] == {"tg": 512} and entry["predicted"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["Apple_M3_Max.json"]


def test_bad_bodies_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFLEET_PROFILE_DIR", str(tmp_path))
    with pytest.raises(profile_file.ProfileFileError, match="not a kernelfleet-profile/1 profile"):
        profile_file.write({"schema": "other", "chip": "x", "entries": []})
    with pytest.raises(profile_file.ProfileFileError, match="without kernel, shape and dtype"):
        profile_file.write({"schema": profile_file.SCHEMA, "chip": "x", "entries": [{"kernel": "rmsnorm"}]})
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "broken.json").write_text("{not json")
    assert profile_file.read("broken") is None
    assert profile_file.lookup("rmsnorm", "4096x4096", "float16", "broken") is None
    (tmp_path / "old.json").write_text(json.dumps({"schema": "kernelfleet-profile/0", "entries": []}))
    assert (
        profile_file.read("old") is None and profile_file.lookup("rmsnorm", "1x1", "float16", "old") is None
    )
