"""Merging a KernelFleet profile into zmlx's autotune cache (``autotune_v3.json``, schema "3.0").

What zmlx 0.10 does (``zmlx/autotune.py``, ``zmlx/device.py``), and so what this module writes:

- the file is ``$ZMLX_CACHE_DIR/autotune_v3.json``, else ``~/.cache/zmlx/autotune_v3.json``;
- ``{"schema_version": "3.0", "devices": {<device key>: {"metadata": {...}, "entries": {...},
  "saved_at": "YYYY-MM-DDTHH:MM:SS"}}}``;
- the device key is ``f"{family}_{variant}".rstrip("_") + "_" + mlx_version``, where zmlx's
  ``detect_device`` takes (family, variant) from the first of its chip names ("Apple M1",
  "Apple M1 Pro", ..., in that order) that the CPU brand string contains. "Apple M3 Max" contains
  "Apple M3", which comes first, so on a Mac every variant gets its base family's key:
  ``M3_0.32.4`` on an M3, M3 Pro, M3 Max alike (:func:`device_key`);
- an entry's key is ``json.dumps({"name", "shapes", "dtypes", "grid", "t_params"})`` of the kernel
  launch (kernel name, input shapes, ``str(dtype)`` of each input such as ``mlx.core.float16``,
  the grid, ``[["tuning", "templates"]]`` when the template was tuned), its value
  ``{"tg": [x, y, z], "template": [[name, value], ...]}``.

Two kinds of entries, written side by side under the device key:

- zmlx's own kernels (the catalog's ``zmlx_*`` family, :func:`zmlx_entries`): the key is exactly
  what ``zmlx.autotune.get_autotuned_config`` builds for the launch zmlx's function makes at the
  tuned config, captured off a Mac (``kernels.zmlx_capture``): zmlx's kernel name
  (``kk_rmsnorm_D4096_TG128_E1e_06``), input shapes, ``str(dtype)``s, grid, and ``t_params`` ``[]``
  (zmlx adds ``["tuning", "templates"]`` only when it searches over several templates); the value is
  ``{"tg": [tg, 1, 1], "template": []}``, as ``autotune_kernel`` stores it (the caller passes its
  own template).
- our own kernels (:func:`kernelfleet_entries`, names ``kf_*``): as below.

KernelFleet's entries come from the exact launch a config makes (``kernels.launch.capture``, which
renders without running, so it works on any machine; the inputs are shape-only placeholders,
``kernels.common.shapes_only``): kernel name, input shapes and dtypes, grid,
threadgroup and template. A dtype template value is written as its name (``"float16"``), the only
JSON form it has. Built-in entries have no launch and are not written. Other devices' entries,
and this device's entries for other keys, are kept. A file that is not valid schema-3.0 JSON is
kept as ``autotune_v3.json.corrupt-<UTC timestamp>`` and a new one is written.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.kernels.patch.profile_file import atomic_write_text

SCHEMA_VERSION = "3.0"
FILE_NAME = "autotune_v3.json"


class ZmlxCacheError(Exception):
    """The zmlx cache could not be written."""


def cache_path() -> Path:
    """Where zmlx reads its autotune cache: ``$ZMLX_CACHE_DIR`` or ``~/.cache/zmlx``."""
    base = os.environ.get("ZMLX_CACHE_DIR")
    return Path(base if base is not None else Path.home() / ".cache" / "zmlx") / FILE_NAME


def _zmlx_chip_names() -> list[tuple[str, tuple[str, str]]]:
    """zmlx's chip names in the order ``detect_device`` tries them: the installed zmlx's own table,
    else the chip table's Apple rows (the same names in the same order as zmlx 0.10's)."""
    try:
        from zmlx.device import _FAMILY_PATTERNS

        return list(_FAMILY_PATTERNS.items())
    except ImportError:
        from kernelfleet.chips import TABLE

        out = []
        for row in TABLE:
            if row.backend == "metal":
                family, _, variant = row.name.removeprefix("Apple ").partition(" ")
                out.append((row.name, (family, variant)))
        return out


def zmlx_family_variant(chip: str) -> tuple[str, str]:
    """(family, variant) as zmlx's ``detect_device`` finds them on a Mac whose CPU brand string is
    ``chip``'s name in the chip table: the first zmlx chip name the brand contains, else Unknown."""
    from kernelfleet.chips import lookup

    row = lookup(chip)
    brand = row.name if row is not None else chip.strip()
    for pattern, (family, variant) in _zmlx_chip_names():
        if pattern in brand:
            return family, variant
    return "Unknown", ""


def device_key(chip: str, mlx_version: str) -> str:
    """zmlx's device key on a Mac with ``chip``: ``M3_0.32.4`` for an M3 Max (see the module doc)."""
    family, variant = zmlx_family_variant(chip)
    return f"{family}_{variant}".rstrip("_") + f"_{mlx_version}"


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    from kernelfleet.kernels.common import dtype_name

    return dtype_name(value)


def launch_entries(kernel: str, shape: str, dtype: str, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The zmlx cache entries (key string -> value) of the launches ``config`` makes at ``shape``:
    :func:`zmlx_entries` for the catalog's zmlx kernels, :func:`kernelfleet_entries` for ours."""
    from kernelfleet.kernels.catalog import ZMLX_NAMES

    if kernel in ZMLX_NAMES:
        return zmlx_entries(kernel, shape, dtype, config)
    return kernelfleet_entries(kernel, shape, dtype, config)


def autotune_key(name: str, shapes: Iterable[Iterable[int]], dtypes: Iterable[Any], grid: Iterable[int],
                 t_params: list[list[str]]) -> str:
    """An entry key as zmlx's ``save_autotune_cache`` writes an ``AutotuneKey``."""
    return json.dumps({"name": name, "shapes": [list(s) for s in shapes], "dtypes": [str(d) for d in dtypes],
                       "grid": list(grid), "t_params": t_params})


def zmlx_entries(kernel: str, shape: str, dtype: str, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The entries of the launches zmlx's own function makes at ``config`` (captured, not run)."""
    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.common import shapes_only
    from kernelfleet.kernels.spec import parse_shape
    from kernelfleet.kernels.zmlx.capture import capture

    spec = get_spec(kernel)
    dims = parse_shape(shape)
    fn = spec.build(config, "metal", dims, dtype)
    with shapes_only():
        inputs = spec.make_inputs(dims, dtype, 0)
    with capture() as records:
        fn(inputs)
    return {autotune_key(r.name, r.input_shapes, r.input_dtypes, r.grid, []):
            {"tg": list(r.threadgroup), "template": []} for r in records}


def kernelfleet_entries(kernel: str, shape: str, dtype: str,
                        config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The entries of the launches our own kernel makes at ``config``."""
    import importlib

    from kernelfleet.kernels.common import shapes_only
    from kernelfleet.kernels.render.launch import capture
    from kernelfleet.kernels.spec import parse_shape

    module = importlib.import_module(f"kernelfleet.kernels.catalog.{kernel}_kernel")
    dims = parse_shape(shape)
    fn = module.make(config, "metal", dims, dtype)
    with shapes_only():  # only the inputs' shapes and dtypes reach the captured launch
        inputs = module.SPEC.make_inputs(dims, dtype, 0)
    with capture() as records:
        fn(inputs)
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        key = autotune_key(rec.rendered.name, rec.input_shapes, rec.input_dtypes, rec.launch.grid,
                           [["tuning", "templates"]])
        out[key] = {
            "tg": list(rec.launch.threadgroup),
            "template": [[name, _plain(value)] for name, value in rec.launch.template],
        }
    return out


@dataclass
class MergeResult:
    path: Path
    device_key: str
    written: int  # entries written for this device key, both kinds
    zmlx_kernels: int = 0  # of those, entries for zmlx's own kernels (the rest are KernelFleet's)
    skipped: list[str] = field(default_factory=list)  # "kernel shape dtype: why"
    backup: Path | None = None  # where an unreadable old file was kept
    kept_devices: int = 0  # other devices' sections left as they were


def _load_existing(path: Path) -> tuple[dict[str, Any], Path | None]:
    """The current cache, or a fresh one (after moving an unreadable file aside)."""
    fresh: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "devices": {}}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return fresh, None
    except OSError as e:
        raise ZmlxCacheError(f"cannot read the zmlx cache {path}: {e}") from e
    try:
        data = json.loads(text)
        valid = (
            isinstance(data, dict)
            and data.get("schema_version") == SCHEMA_VERSION
            and isinstance(data.get("devices"), dict)
            and all(
                isinstance(d, dict) and isinstance(d.get("entries", {}), dict)
                for d in data["devices"].values()
            )
        )
    except ValueError:
        valid = False
    if valid:
        return data, None
    backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    n = 1
    while backup.exists():
        backup = backup.with_name(f"{backup.name.split('~')[0]}~{n}")
        n += 1
    os.replace(path, backup)
    return fresh, backup


def merge(
    profile: dict[str, Any],
    key: str,
    metadata: dict[str, Any],
    *,
    path: Path | None = None,
    entries_of: Callable[[str, str, str, dict[str, Any]], dict[str, dict[str, Any]]] = launch_entries,
    progress: Callable[[Iterable[dict[str, Any]]], Iterable[dict[str, Any]]] = lambda it: it,
) -> MergeResult:
    """Write ``profile``'s custom-config entries under device ``key``, keeping everything else."""
    target = path or cache_path()
    from kernelfleet.kernels.catalog import ZMLX_NAMES

    entries: dict[str, dict[str, Any]] = {}
    zmlx_keys: set[str] = set()
    skipped: list[str] = []
    for e in progress(profile.get("entries", [])):
        config = e.get("config") or {}
        if config == {"variant": "builtin"}:
            continue
        try:
            made = entries_of(e["kernel"], e["shape"], e["dtype"], dict(config))
            entries.update(made)
            if e["kernel"] in ZMLX_NAMES:
                zmlx_keys.update(made)
        except Exception as exc:  # an entry the local catalog cannot render: report it, keep going
            skipped.append(f"{e.get('kernel')} {e.get('shape')} {e.get('dtype')}: {exc}")
    data, backup = _load_existing(target)
    devices: dict[str, Any] = data["devices"]
    section = devices.get(key) if isinstance(devices.get(key), dict) else {}
    assert section is not None
    merged = dict(section.get("entries") or {})
    merged.update(entries)
    devices[key] = {
        "metadata": {**(section.get("metadata") or {}), **metadata},
        "entries": merged,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    data["schema_version"] = SCHEMA_VERSION
    try:
        atomic_write_text(target, json.dumps(data, indent=2) + "\n")
    except OSError as e:
        raise ZmlxCacheError(f"cannot write the zmlx cache {target}: {e}") from e
    return MergeResult(
        path=target,
        device_key=key,
        written=len(entries),
        zmlx_kernels=len(zmlx_keys),
        skipped=skipped,
        backup=backup,
        kept_devices=len(devices) - 1,
    )
