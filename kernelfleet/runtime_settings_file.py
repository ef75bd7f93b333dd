"""The runtime-settings file: a chip's chosen MLX runtime settings per (model shape, dtype,
workload), as ``kernelfleet settings tune`` writes it and a profile would carry it. Standard
library only (read before MLX is imported, to set its environment)::

    {"schema": "kernelfleet-runtime-settings/1", "chip": "NVIDIA H100 80GB HBM3", "backend": "cuda",
     "arch": "sm_90", "mlx_version": "0.32.4",
     "entries": [{"model": "llama h4096 x8", "dtype": "bf16", "workload": "decode:8",
                  "settings": {"MLX_MAX_MB_PER_BUFFER": "500", "MLX_MAX_OPS_PER_BUFFER": "50"},
                  "gain": 1.18, "interval": [1.09, 1.25], "verdict": "faster", "bit_identical": true,
                  "rounds": 5, "round_gains": [1.18, 1.22, 1.09, 1.25, 1.16],
                  "control": {"gain": 1.01, "interval": [0.97, 1.04]},
                  "evidence": [{"stage": "coarse", "settings": {...}, "gain": ..., "interval": [...],
                                "verdict": ..., "rounds": ..., "bit_identical": ...}, ...],
                  "note": ""}, ...]}

``settings`` {}: MLX's defaults stay (none was faster beyond the noise, or the budget ran out:
``note`` says which). ``gain``/``interval``: the chosen settings' speed over the defaults in the
confirmation rounds, paired by round (95 % bootstrap); ``control``: stock against stock in the same
rounds, the pairing's own noise; ``round_gains``: the gain in each confirmation round (the control's
where the defaults stay), which the coordinator compares across MLX versions. ``model``:
:func:`shape_key` of the model's config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelfleet.local_state import chip_slug, profile_dir

SCHEMA = "kernelfleet-runtime-settings/1"
# a fleet job that searches runtime settings (jobs.kind 'runtime_settings') names this as its kernel, and a
# regression of a setting's gain names it too: its series are (chip, model + workload, dtype)
JOB_KERNEL = "runtime_settings"
QUANTIZATIONS = ("bf16", "4bit", "8bit")


class SettingsFileError(ValueError):
    """A file that is not a runtime-settings file."""


def shape_key(config: dict[str, Any]) -> str:
    """What the settings depend on in a model's config: architecture, width, depth, experts."""
    out = f"{config['model_type']} h{config['hidden_size']} x{config['num_hidden_layers']}"
    if config.get("num_experts"):
        out += f" e{config['num_experts']}/{config.get('num_experts_per_tok')}"
    return out


def dtype_label(quant: str, compute_dtype: str = "bfloat16") -> str:
    """An entry's ``dtype``: the model's quantization (``bf16``, ``4bit``, ``8bit``), with the
    activations' dtype where it is not bfloat16 (``float32``, ``4bit float32``)."""
    own = "" if compute_dtype == "bfloat16" else compute_dtype
    if quant == "bf16":
        return own or "bf16"
    return f"{quant} {own}".strip()


def installed_path(chip: str) -> Path:
    """Where ``settings tune`` writes a chip's file and ``kernelfleet pull`` installs the fleet's:
    ``<profile dir>/<chip>.settings.json``, beside the chip's profile."""
    return profile_dir() / f"{chip_slug(chip)}.settings.json"


def read(path: str | Path) -> dict[str, Any]:
    try:
        body = json.loads(Path(path).read_text())
    except OSError as e:
        raise SettingsFileError(f"{path}: cannot read it ({e.strerror})") from e
    except json.JSONDecodeError as e:
        raise SettingsFileError(f"{path}: not JSON ({e})") from e
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        raise SettingsFileError(f"{path}: not a runtime-settings file (schema {SCHEMA!r})")
    return body


def write(body: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)


def merge(body: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``body`` with ``entries`` replacing those of the same (model, dtype, workload)."""
    keys = {(e["model"], e["dtype"], e["workload"]) for e in entries}
    kept = [e for e in body.get("entries", []) if (e["model"], e["dtype"], e["workload"]) not in keys]
    return {**body, "entries": kept + entries}


def select(body: dict[str, Any], model: str | None = None, dtype: str | None = None,
           workload: str | None = None) -> list[dict[str, Any]]:
    """The entries matching every filter given."""
    return [e for e in body.get("entries", [])
            if (model is None or e["model"] == model) and (dtype is None or e["dtype"] == dtype)
            and (workload is None or e["workload"] == workload)]
