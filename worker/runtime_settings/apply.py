"""Set MLX's runtime settings from a runtime-settings file (:mod:`kernelfleet.runtime_settings_file`)
before MLX starts.

MLX reads each knob once, into a C++ function-local ``static``, at the knob's first use (the device,
a command encoder, the first ``eval``; see :mod:`.knobs`), and nothing in MLX's Python API says
whether that has happened. What can be told is whether ``mlx.core`` is imported in this process:

- not imported: setting ``os.environ`` now is read by MLX (``std::getenv`` sees ``putenv``), so
  :func:`apply` sets each chosen variable, unless the environment already sets it (the user's
  value stays, and a line says so);
- imported: MLX may have read the knobs already, and whether it has cannot be told, so nothing is
  set (a half-applied setting would make the process's speed depend on what ran first) and
  :func:`apply` prints the environment line to set before Python starts, and why.

Standard library only: ``import kernelfleet; kernelfleet.apply_settings(...)`` imports no mlx.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet import runtime_settings_file as settings_file
from kernelfleet.runtime_settings_file import SettingsFileError


def _model_key(model: str | Path | dict[str, Any] | None) -> str | None:
    if model is None:
        return None
    if isinstance(model, dict):
        return settings_file.shape_key(model)
    if str(model).endswith(".json"):
        import json

        return settings_file.shape_key(json.loads(Path(model).read_text()))
    return str(model)


def chosen(body: dict[str, Any], model: str | Path | dict[str, Any] | None = None, dtype: str | None = None,
           workload: str | None = None) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The settings the matching entries chose, and those entries; entries that disagree on a
    variable's value are an error (one process has one environment: name the workload)."""
    entries = settings_file.select(body, _model_key(model), dtype, workload)
    out: dict[str, str] = {}
    for e in entries:
        for env, value in e.get("settings", {}).items():
            if out.setdefault(env, value) != value:
                raise SettingsFileError(
                    f"the matching entries disagree on {env} ({out[env]} and {value}): give the model, "
                    f"dtype and workload (e.g. workload='decode:1')")
    return out, entries


def apply(settings: str | Path | dict[str, Any], *, model: str | Path | dict[str, Any] | None = None,
          dtype: str | None = None, workload: str | None = None,
          echo: Callable[[str], None] = print) -> dict[str, str]:
    """Set the chosen runtime settings in this process's environment; what was set. ``settings``: a
    runtime-settings file or its body; ``model``: a config.json (path or dict) or a shape key."""
    body = settings if isinstance(settings, dict) else settings_file.read(settings)
    wanted, entries = chosen(body, model, dtype, workload)
    if not entries:
        echo(f"kernelfleet: no runtime settings for {_model_key(model) or 'any model'} "
             f"{dtype or ''} {workload or ''} in the file for {body.get('chip')}: MLX's defaults stay")
        return {}
    why = ", ".join(f"{e['workload']} {e.get('gain', 1):.2f}x" for e in entries if e.get("settings"))
    if "mlx.core" in sys.modules:
        if wanted:
            line = " ".join(f"{k}={v}" for k, v in sorted(wanted.items()))
            echo(f"kernelfleet: MLX is already imported, and it reads its runtime settings once, at their "
                 f"first use, which cannot be told from Python: nothing was set. Set them before Python "
                 f"starts: export {line}   (chosen on {body.get('chip')}: {why})")
        return {}
    done: dict[str, str] = {}
    for env, value in sorted(wanted.items()):
        if env in os.environ and os.environ[env] != value:
            echo(f"kernelfleet: kept {env}={os.environ[env]} from the environment (the file chose {value})")
            continue
        os.environ[env] = value
        done[env] = value
    return done
