"""``kernelfleet kernels`` and ``kernelfleet tune``: the catalog and local tuning (mlx + numpy only)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kernelfleet.console import stdout_console
from kernelfleet.kernels.spec import DTYPES, KernelError
from kernelfleet.worker.backends import BackendError
from kernelfleet.worker.measure import MeasureError
from kernelfleet.worker.revision import REVISION_RE
from kernelfleet.worker.search import DEFAULT_STRATEGY, strategy_names
from kernelfleet.worker.search.base import SearchError

USAGE_ERROR = 2

# Piped or redirected output gets a wide table rather than rich's 80-column default, which wraps
# the headers and long config keys.
out_console = stdout_console()
err_console = Console(stderr=True, soft_wrap=True)


def _fail(message: str, code: int) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.1f} µs" if x < 10_000 else f"{x / 1000:,.2f} ms"


def _fmt_err(x: float | None) -> str:
    return "—" if x is None else f"{x:.2e}"


def trials_table(report: dict[str, Any]) -> Table:
    """The report's trials, fastest first, failures last."""
    trials = report["trials"]
    builtin = next((t for t in trials if t["is_builtin"]), None)
    base = builtin["median_us"] if builtin and builtin["status"] == "ok" else None
    table = Table(title=f"{report['kernel']} {report['shape']} {report['dtype']} on {report['env']['chip']} "
                        f"({report['env']['backend']}, {report['strategy']})")
    for col, justify in (("config", "left"), ("median", "right"), ("p10–p90", "right"), ("n", "right"),
                         ("max abs err", "right"), ("speedup", "right"), ("status", "left")):
        table.add_column(col, justify=justify, no_wrap=col == "config")  # type: ignore[arg-type]
    ranked = sorted(trials, key=lambda t: (t["median_us"] is None, t["median_us"] or math.inf))
    for t in ranked:
        speed = f"{base / t['median_us']:.2f}×" if base and t["median_us"] else "—"
        spread = (f"{_fmt_us(t['p10_us'])} – {_fmt_us(t['p90_us'])}" if t["p10_us"] is not None else "—")
        status = t["status"] if t["status"] == "ok" else f"[red]{t['status']}[/]: {(t['error'] or '')[:60]}"
        best = " [bold green](best)[/]" if t["config_key"] == report["best_config_key"] else ""
        table.add_row(t["config_key"] + best, _fmt_us(t["median_us"]), spread, str(t["n"]),
                      _fmt_err(t["max_abs_err"]), speed, status)
    return table


def kernels_command() -> None:
    """List the kernel catalog."""
    from kernelfleet.worker.tuner import all_specs

    try:
        specs = all_specs()
    except KernelError as e:
        raise _fail(str(e), 1) from e
    table = Table(title="KernelFleet kernel catalog")
    table.add_column("name", no_wrap=True)
    for col in ("dtypes", "description", "shape"):
        table.add_column(col)
    for spec in sorted(specs, key=lambda s: s.name):
        # Text, not markup: descriptions hold brackets ("returns [normed, new residual]")
        table.add_row(spec.name, ", ".join(spec.dtypes), Text(spec.description), Text(spec.shape_doc))
    from kernelfleet.kernels.catalog import zmlx_specs

    for spec in zmlx_specs():  # zmlx's own kernels (kernels/zmlx_family.py)
        table.add_row(spec.name, ", ".join(spec.dtypes),
                      Text(f"{spec.description} [Metal only, needs zmlx]"), Text(spec.shape_doc))
    out_console.print(table)


def tune_command(
    kernel: str = typer.Argument(..., help="catalog kernel name (see `kernelfleet kernels`)"),
    shape: str = typer.Option(..., "--shape", help="shape like 4096x4096 (see the kernel's shape doc)"),
    dtype: str = typer.Option("float16", "--dtype", help=f"one of {', '.join(DTYPES)}"),
    strategy: str = typer.Option(DEFAULT_STRATEGY, "--strategy",
                                 help=f"one of {', '.join(strategy_names())}"),
    seed: int = typer.Option(0, "--seed", help="seed for inputs and measurement order"),
    budget: float | None = typer.Option(None, "--budget", help="soft limit on the search, in seconds"),
    backend: str | None = typer.Option(None, "--backend", help="metal, cuda or cpu (default: detected)"),
    as_json: bool = typer.Option(False, "--json", help="print the tuning report as JSON on stdout"),
    out: Path | None = typer.Option(None, "--out", help="append the report as one JSON line to this file"),
    revision: str | None = typer.Option(None, "--revision",
                                        help="the kernels' source revision to record, e.g. a git commit "
                                             "(default: this install's git commit, else its version)"),
) -> None:
    """Tune one kernel for one shape and dtype on this machine."""
    from kernelfleet.worker.backends import get_backend
    from kernelfleet.worker.search import Budget, get_strategy
    from kernelfleet.worker.tuner import get_spec, resolve, tune

    try:  # bad input fails here, before any progress bar is drawn
        resolve(get_spec(kernel), shape, dtype)
        get_strategy(strategy)
        Budget(budget)
        if backend is not None:
            get_backend(backend)
        if revision is not None and not REVISION_RE.match(revision):
            raise _fail(f"--revision {revision!r}: use 1-64 letters, digits and . _ + - "
                        f"(a git commit or a version)", USAGE_ERROR)
    except (KernelError, SearchError, BackendError) as e:
        raise _fail(str(e), USAGE_ERROR) from e
    if out is not None:  # find an unwritable --out before tuning, not after
        try:
            out.open("a", encoding="utf-8").close()
        except OSError as e:
            raise _fail(f"cannot append to {out}: {e.strerror or e}", USAGE_ERROR) from e

    progress = Progress(TextColumn(f"tuning {kernel} {shape} {dtype}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err_console, transient=True)
    task = progress.add_task("tune", total=None)

    def on_progress(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    try:
        with progress:
            report = tune(kernel, shape, dtype, strategy=strategy, seed=seed, budget=budget, backend=backend,
                          revision=revision,
                          progress=on_progress)
    except (KernelError, SearchError, BackendError) as e:
        raise _fail(str(e), USAGE_ERROR) from e
    except MeasureError as e:
        raise _fail(str(e), 1) from e

    line = json.dumps(report, allow_nan=False)
    if out is not None:
        try:
            with out.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as e:
            raise _fail(f"cannot append to {out}: {e.strerror or e}", 1) from e
    if as_json:
        print(line)
    else:
        out_console.print(trials_table(report))
        if out is not None:
            err_console.print(f"appended the report to {out}")


def register(app: typer.Typer) -> None:
    """Add ``kernels`` and ``tune`` to the main app."""
    app.command("kernels")(kernels_command)
    app.command("tune")(tune_command)
