"""``kernelfleet pull``: install this chip's learned profile (KernelFleet's profile file and zmlx's
autotune cache). Exit codes: 0 done, 1 could not pull (message on stderr; files untouched), e.g. a
chip with no measured results without ``--allow-predicted``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from kernelfleet.worker.plural import plural
from kernelfleet.worker.pull import DEFAULT_COORDINATOR, PullError, pull, resolve_token


def register(app: typer.Typer) -> None:
    """Add ``pull`` to the main app."""
    app.command("pull")(pull_command)


def pull_command(
    coordinator: Annotated[
        str, typer.Option("--coordinator", envvar="KERNELFLEET_COORDINATOR", help="The coordinator's URL")
    ] = DEFAULT_COORDINATOR,
    chip: Annotated[
        str, typer.Option("--chip", help="'auto' (this machine) or a chip name, e.g. 'Apple M3 Max'")
    ] = "auto",
    mlx_version: Annotated[
        str | None,
        typer.Option(
            "--mlx-version",
            help="Use only results from this MLX version (and key zmlx's cache by it); "
            "default: every version, zmlx keyed by the installed MLX",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            show_default=False,
            help="A read (or admin) token, when the coordinator's reads are not public [default: "
            "KERNELFLEET_TOKEN, KERNELFLEET_ADMIN_TOKEN, or a local-mode coordinator's stored token]",
        ),
    ] = None,
    admin_token: Annotated[
        str | None, typer.Option("--admin-token", hidden=True, help="The old name of --token")
    ] = None,
    zmlx: Annotated[
        bool, typer.Option("--zmlx/--no-zmlx", help="Also merge into zmlx's autotune cache")
    ] = True,
    allow_predicted: Annotated[
        bool, typer.Option("--allow-predicted", help="For a chip with no measured results: install "
                           "predicted entries (marked as such) from the most similar chips")
    ] = False,
) -> None:
    """Fetch this chip's profile from the coordinator; write the profile file and merge zmlx's cache."""
    out = Console(soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    with Progress(console=err, transient=True) as bar:

        def progress(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            listed = list(items)
            task = bar.add_task("rendering zmlx cache entries", total=len(listed))
            for item in listed:
                yield item
                bar.advance(task)

        try:
            result = pull(coordinator, chip, mlx_version, zmlx=zmlx, allow_predicted=allow_predicted,
                          token=resolve_token(token or admin_token, coordinator), progress=progress)
        except PullError as e:
            err.print(f"[bold red]error:[/] {e}", highlight=False)
            raise typer.Exit(1) from e
    state = "unchanged" if result.unchanged else "installed"
    entries = plural(result.entries, "entry", "entries")
    why = ", ".join(f"{n} {reason}" for reason, n in result.fallbacks.items())
    fell_back = f"; {result.fallback} of them the built-in: {why}" if result.fallback else ""
    out.print(
        f"profile for {result.target.chip} version {result.version} {state}: {entries} "
        f"({result.predicted} predicted{fell_back}) -> {result.profile_path}",
        highlight=False,
    )
    if result.zmlx is not None:
        z = result.zmlx
        out.print(
            f"zmlx cache: {plural(z.written, 'entry', 'entries')} under {z.device_key} -> {z.path} "
            f"({z.zmlx_kernels} for zmlx's own kernels, {z.written - z.zmlx_kernels} for KernelFleet's; "
            f"{plural(z.kept_devices, 'other device')} kept)",
            highlight=False,
        )
        if z.backup is not None:
            err.print(
                f"[yellow]warning:[/] the old zmlx cache was not valid schema-3.0 JSON; kept it as "
                f"{z.backup}",
                highlight=False,
            )
        for line in z.skipped:
            err.print(f"[yellow]skipped for zmlx:[/] {line}", highlight=False)
    else:
        out.print(f"zmlx cache: skipped ({result.zmlx_skipped})", highlight=False)
    if result.settings_path:
        out.print(f"runtime settings: {plural(result.settings_entries, 'entry', 'entries')} -> "
                  f"{result.settings_path} (kernelfleet.apply_settings(path, model=..., workload=...) before "
                  f"importing mlx; `kernelfleet settings show FILE` prints them)", highlight=False)
    else:
        out.print("runtime settings: none measured for this chip (MLX's defaults stay)", highlight=False)
