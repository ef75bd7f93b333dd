"""One search of MLX's runtime settings on this machine, as ``kernelfleet settings tune`` runs it and as
a worker runs a leased ``runtime_settings`` job (its campaign's ``runtime_settings``: the model's
config, quantization, workloads and the tuner's knobs; the worker's ``--budget``), answering a
runtime-settings file body (:mod:`kernelfleet.runtime_settings_file`) for this machine's chip.

Where this MLX reads none of the knobs (:func:`.knobs.knobs` has none for its backend and version), no
process is started: every workload keeps MLX's defaults, with a note saying why, and the job is done
(another worker of the same chip and MLX would find the same), not failed.
"""

from __future__ import annotations

from typing import Any

from kernelfleet import runtime_settings_file as settings_file

from .knobs import Knob, knobs
from .search import Choice, Log, Objective, search


def local_knobs(only: list[str] | tuple[str, ...] = ()) -> tuple[str, str, tuple[Knob, ...], str]:
    """(backend, MLX version, the knobs this MLX reads, why there are none) on this machine; ``only``:
    just the knobs of these environment variables."""
    import mlx.core as mx

    from kernelfleet.chips import gpu_backend_available

    backend = gpu_backend_available() or "cpu"
    mlx_version = str(getattr(mx, "__version__", "unknown"))
    try:
        table = knobs(backend, mlx_version)
    except ValueError as e:
        return backend, mlx_version, (), str(e)
    if only:
        table = tuple(k for k in table if set(k.envs) & set(only))
    why = "" if table else (f"MLX {mlx_version} on {backend} reads none of the runtime knobs"
                            + (f" {', '.join(only)}" if only else "") + " (docs/runtime_settings.md)")
    return backend, mlx_version, table, why


def objective(request: dict[str, Any]) -> Objective:
    """A runtime_settings job's request (the lease's ``runtime_settings``) as the search's objective."""
    from kernelfleet.kernels.patch.model_build import parse_dtype

    return Objective(request["config"], request.get("compute_dtype", "bfloat16"),
                     parse_dtype(request.get("quantization", "bf16")), tuple(request["workloads"]),
                     int(request.get("context", 512)), int(request.get("steps", 64)),
                     int(request.get("reps", 3)))


def run(goal: Objective, table: tuple[Knob, ...], *, budget_s: float, rounds: int, log: Log,
        why_none: str = "") -> dict[str, Any]:
    """The search of ``table``'s knobs for ``goal`` (none: MLX's defaults, noted ``why_none``), as a
    runtime-settings file body for the chip the steps ran on."""
    model = settings_file.shape_key(goal.config)
    if table:
        choices, device = search(goal, table, budget_s=budget_s, rounds=rounds, log=log)
    else:
        from kernelfleet.chips import detect_chip

        chip = detect_chip()
        choices = {w: Choice(w, note=why_none) for w in goal.workloads}
        device = {"device": chip.name, "backend": chip.backend, "arch": chip.arch,
                  "mlx_version": chip.mlx_version}
    return {"schema": settings_file.SCHEMA, "chip": device["device"], "backend": device["backend"],
            "arch": device["arch"], "mlx_version": device["mlx_version"],
            "entries": [c.entry(model, goal.label) for c in choices.values()]}


DEFAULT_BUDGET = 900.0  # seconds, as `kernelfleet settings tune --budget`


def run_leased(request: dict[str, Any], budget_s: float | None, log: Log) -> dict[str, Any]:
    """A leased runtime_settings job: its search on this machine within ``budget_s`` (the worker's
    ``--budget``; None: :data:`DEFAULT_BUDGET`)."""
    _, _, table, why = local_knobs()
    return run(objective(request), table, budget_s=DEFAULT_BUDGET if budget_s is None else budget_s,
               rounds=int(request.get("rounds", 5)), log=log, why_none=why)
