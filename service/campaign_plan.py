"""The plan of ``kernelfleet admin campaign create``: each kernel's shapes, from ``--kernel`` x ``--shape``,
``--kernel-shape KERNEL=SHAPE`` or a model's ``config.json`` (:mod:`kernelfleet.kernels.model_shapes`),
printed before anything is queued."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from kernelfleet.kernels.model_shapes import (
    DEFAULT_DECODE,
    DEFAULT_PREFILL,
    ModelConfigError,
    derive,
    load_config,
)


def _fail(err: Console, message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(1)


def shape_sets(*, kernel: Sequence[str], shape: Sequence[str], kernel_shape: Sequence[str],
               from_model: Path | None, decode: Sequence[int] | None, prefill: Sequence[int] | None,
               dtype: Sequence[str], name: str | None, out: Console,
               err: Console) -> tuple[dict[str, list[str]], list[str], str]:
    """(kernel -> shapes, dtypes, name) from the command's options; prints the plan. Raises
    ``typer.Exit(1)`` with one clear line for options that do not make a campaign."""
    sites: dict[str, list[str]] = {}
    notes: list[str] = []
    if from_model is not None:
        if kernel or shape or kernel_shape:
            raise _fail(err, "--from-model derives the kernels and shapes; drop --kernel, --shape and "
                             "--kernel-shape")
        try:
            config = load_config(from_model)
            plan = derive(config, decode=decode if decode is not None else DEFAULT_DECODE,
                          prefill=prefill if prefill is not None else DEFAULT_PREFILL, dtypes=dtype or None)
        except ModelConfigError as e:
            raise _fail(err, str(e)) from None
        sets, dtypes, sites, notes = plan.kernel_shapes, plan.dtypes, plan.sites, plan.notes
        name = name or f"{plan.model_type} ({from_model.resolve().parent.name})"
        dims = ", ".join(f"{k} {v}" for k, v in plan.dims.items())
        out.print(f"model {plan.model_type}: {dims}", highlight=False, soft_wrap=True)
        out.print(f"token counts: decode batches {', '.join(map(str, decode or DEFAULT_DECODE))}; "
                  f"prefill lengths {', '.join(map(str, prefill or DEFAULT_PREFILL))}", highlight=False)
    else:
        if decode or prefill:
            raise _fail(err, "--decode and --prefill go with --from-model")
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
    print_plan(out, sets, dtypes, sites, notes)
    return sets, dtypes, name


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
