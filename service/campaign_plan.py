"""The plan of ``kernelfleet admin campaign create``: each kernel's shapes, from ``--kernel`` x ``--shape``,
``--kernel-shape KERNEL=SHAPE`` or a model's ``config.json`` (:mod:`kernelfleet.kernels.patch.model_shapes`),
and with ``--runtime-settings`` the model's runtime-settings jobs (:func:`runtime_settings`), printed
before anything is queued."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelfleet.kernels.patch.model_shapes import (
    DEFAULT_DECODE,
    DEFAULT_PREFILL,
    DEFAULT_VERIFY,
    ModelConfigError,
    derive,
    load_config,
)
from kernelfleet.service import campaign_checks


def _fail(err: Console, message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(1)


def shape_sets(*, kernel: Sequence[str], shape: Sequence[str], kernel_shape: Sequence[str],
               from_model: Path | None, decode: Sequence[int] | None, prefill: Sequence[int] | None,
               dtype: Sequence[str], name: str | None, out: Console, err: Console,
               backend: str | None = None, chip: str | None = None, verify: Sequence[int] | None = None,
               ) -> tuple[dict[str, list[str]], list[str], str]:
    """(kernel -> shapes, dtypes, name) from the command's options, checked as the coordinator checks
    them (:mod:`kernelfleet.service.campaign_checks`), then prints the plan. Raises ``typer.Exit(1)``
    with one line per problem, naming the option it came from, before printing anything."""
    sites: dict[str, list[str]] = {}
    notes: list[str] = []
    if from_model is not None:
        if kernel or shape or kernel_shape:
            raise _fail(err, "--from-model derives the kernels and shapes; drop --kernel, --shape and "
                             "--kernel-shape")
        try:
            config = load_config(from_model)
            plan = derive(config, decode=decode if decode is not None else DEFAULT_DECODE,
                          prefill=prefill if prefill is not None else DEFAULT_PREFILL, dtypes=dtype or None,
                          verify=verify if verify is not None else DEFAULT_VERIFY)
        except ModelConfigError as e:
            raise _fail(err, str(e)) from None
        sets, dtypes, sites, notes = plan.kernel_shapes, plan.dtypes, plan.sites, plan.notes
        name = name or f"{plan.model_type} ({from_model.resolve().parent.name})"
        dims = ", ".join(f"{k} {v}" for k, v in plan.dims.items())
        out.print(f"model {plan.model_type}: {dims}", highlight=False, soft_wrap=True)
        line = (f"token counts: decode batches {', '.join(map(str, decode or DEFAULT_DECODE))}; "
                f"prefill lengths {', '.join(map(str, prefill or DEFAULT_PREFILL))}")
        if "quantized_matmul" in sets:
            counts = ", ".join(map(str, verify or DEFAULT_VERIFY))
            line += f"; quantized matmuls also at {counts} (draft-verify)"
        out.print(line, highlight=False)
    else:
        if decode or prefill or verify:
            raise _fail(err, "--decode, --prefill and --verify go with --from-model")
        if bool(kernel) != bool(shape):
            raise _fail(err, "--kernel and --shape go together (every kernel at every shape)")
        if not kernel and not kernel_shape:
            raise _fail(err, "give --kernel and --shape, --kernel-shape KERNEL=SHAPE, or --from-model PATH")
        if not name:
            raise _fail(err, "--name is required (except with --from-model)")
        if not dtype:
            raise _fail(err, "--dtype is required (except with --from-model)")
        sets = {k: list(shape) for k in kernel}
        for item in kernel_shape:
            k, sep, s = item.partition("=")
            if not sep or not k or not s:
                raise _fail(err, f"--kernel-shape {item!r}: expected KERNEL=SHAPE, e.g. rope=32x1x128")
            sets.setdefault(k, []).append(s)
        dtypes = list(dtype)
    found = [*_option_problems(sets, dtypes, kernel, from_model is not None),
             *_target_problems(list(sets), backend, chip, name)]
    if found:
        for problem in found[:20]:
            err.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
        more = f" ({len(found) - 20} more not shown)" if len(found) > 20 else ""
        raise _fail(err, f"nothing was queued: fix the options above{more}")
    print_plan(out, sets, dtypes, sites, notes)
    return sets, dtypes, name


def _option_problems(sets: dict[str, list[str]], dtypes: list[str], paired: Sequence[str],
                     from_model: bool) -> list[str]:
    """The coordinator's checks, each problem named by the option that gave the value."""
    if from_model:
        return campaign_checks.problems(
            sets, dtypes, kernel_at=lambda k: "--from-model: ",
            shape_at=lambda k, s: f"--from-model: kernel {k!r}, shape {s!r}: ",
            dtype_at=lambda d: f"--dtype {d!r}: ")
    return campaign_checks.problems(
        sets, dtypes,
        kernel_at=lambda k: f"--kernel {k!r}: " if k in paired else f"--kernel-shape {k}=...: ",
        shape_at=lambda k, s: f"--shape {s!r} (kernel {k}): " if k in paired else f"--kernel-shape {k}={s}: ",
        dtype_at=lambda d: f"--dtype {d!r}: ")


def _target_problems(kernels: list[str], backend: str | None, chip: str | None, name: str) -> list[str]:
    out = []
    if len(name) > 128:
        out.append(f"--name: at most 128 characters, got {len(name)}")
    if chip is not None and not 1 <= len(chip) <= 128:
        out.append("--chip: a chip name or glob of 1-128 characters, e.g. 'Apple M3*'")
    if backend is not None and backend not in campaign_checks.BACKENDS:
        return [*out, f"--backend {backend!r}: choose {', '.join(campaign_checks.BACKENDS)}"]
    try:
        campaign_checks.backend_for([k for k in kernels if _known(k)], backend, chip)
    except ValueError as e:
        flag = "--chip" if str(e).startswith("target_chip") else "--backend"
        out.append(f"{flag} {chip if flag == '--chip' else backend!r}: "
                   + str(e).replace("target_backend", "--backend").replace("target_chip", "--chip"))
    return out


def _known(kernel: str) -> bool:
    return kernel in campaign_checks.NAMES or kernel in campaign_checks.ZMLX_NAMES


def print_plan(out: Console, sets: dict[str, list[str]], dtypes: list[str], sites: dict[str, list[str]],
               notes: list[str]) -> None:
    jobs = sum(len(v) for v in sets.values()) * len(dtypes)
    table = Table(title=f"plan: {len(sets)} kernels x their shapes x {len(dtypes)} dtypes "
                        f"({', '.join(dtypes)}) = {jobs} jobs")
    for col in ("kernel", "shapes", "jobs", *(("called at",) if sites else ())):
        table.add_column(col)
    for k, shapes in sets.items():
        row = [k, " ".join(shapes), str(len(shapes) * len(dtypes))]
        table.add_row(*row, *(("; ".join(sites.get(k, [])),) if sites else ()))
    out.print(table)
    for note in notes:
        out.print(f"note: {note}", highlight=False, soft_wrap=True)


def runtime_settings(from_model: Path | None, *, quantization: Sequence[str], workload: Sequence[str],
                     layers: int, out: Console, err: Console) -> dict[str, Any]:
    """The ``runtime_settings`` of a campaign's body from ``--from-model`` (quantization: the
    ``--runtime-dtype`` values, else the model's own: its config's ``quantization`` bits, else bf16),
    checked as the coordinator checks it, then its plan printed: one job per quantization and chip."""
    from pydantic import ValidationError

    from kernelfleet.runtime_settings_file import shape_key
    from kernelfleet.service.schemas import RUNTIME_WORKLOADS, RuntimeSettingsPlan

    if from_model is None:
        raise _fail(err, "--runtime-settings goes with --from-model (the model whose settings are searched)")
    try:
        config = load_config(from_model)
    except ModelConfigError as e:
        raise _fail(err, str(e)) from None
    own = config.get("quantization") or config.get("quantization_config") or {}
    bits = own.get("bits") if isinstance(own, dict) else None
    own_dtype = f"{bits}bit" if bits in (4, 8) else "bf16"
    body: dict[str, Any] = {"config": config, "quantizations": list(quantization) or [own_dtype],
                            "workloads": list(workload) or RUNTIME_WORKLOADS, "layers": layers}
    try:
        plan = RuntimeSettingsPlan.model_validate(body)
    except ValidationError as e:
        for problem in e.errors()[:10]:
            where = {"quantizations": "--runtime-dtype", "workloads": "--runtime-workload",
                     "layers": "--runtime-layers"}.get(str(problem["loc"][0]) if problem["loc"] else "",
                                                       "--from-model")
            value = f" {problem['input']!r}" if problem["loc"] and len(problem["loc"]) > 1 else ""
            err.print(f"[bold red]error:[/] {where}{value}: {escape(problem['msg'])}", highlight=False,
                      soft_wrap=True)
        raise _fail(err, "nothing was queued: fix the options above") from None
    dtypes = plan.job_dtypes()
    out.print(f"runtime settings: {shape_key(plan.config)} x {', '.join(dtypes)} at "
              f"{', '.join(plan.workloads)}: one job per dtype and enrolled chip the campaign targets (MLX's "
              f"runtime knobs searched on that chip's worker, within its --budget)", highlight=False,
              soft_wrap=True)
    return body
