"""The ``kernelfleet`` command line.

Each area registers its own commands on the one Typer app:

- ``kernelfleet.service.cli``   serve, db, admin, import      (needs the coordinator's dependencies)
- ``kernelfleet.worker.tune_cli``  kernels, tune              (mlx + numpy only)
- ``kernelfleet.worker.agent_cli`` worker
- ``kernelfleet.worker.pull_cli``  pull
- ``kernelfleet.worker.settings_cli`` settings             (MLX's runtime settings: tune, show)

On a bare GPU host without FastAPI/SQLAlchemy the coordinator commands are simply absent.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import click
import typer
from rich.console import Console

from kernelfleet.worker.cli_help import plain_metavars

app = typer.Typer(
    name="kernelfleet",
    help="Tune MLX GPU kernels on every chip you own.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

def _version(value: bool) -> None:
    if not value:
        return
    found = []
    for dist in ("kernelfleet", "mlx"):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    typer.echo(", ".join(found))
    raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Show the KernelFleet and MLX versions and exit")
                            ] = False,
) -> None:
    """Tune MLX GPU kernels on every chip you own."""


_COMMAND_MODULES = (
    "kernelfleet.service.cli",
    "kernelfleet.worker.tune_cli",
    "kernelfleet.worker.agent_cli",
    "kernelfleet.worker.pull_cli",
    "kernelfleet.worker.settings_cli",
)
_missing: list[str] = []

for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as _e:  # a third-party dependency absent on this host
        if _e.name and _e.name.startswith("kernelfleet"):
            raise
        _missing.append(f"{_name.rsplit('.', 1)[-1]} (needs {_e.name})")
        continue
    _module.register(app)


def command() -> click.Command:
    """The click command tree ``main`` runs, with plain metavars in its help."""
    return plain_metavars(typer.main.get_command(app))


def main() -> None:
    """Entry point: no stack trace reaches the user unless KERNELFLEET_DEBUG=1."""
    logging.basicConfig(level=os.environ.get("KERNELFLEET_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        command()(prog_name="kernelfleet")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        sys.exit(130)
    except Exception as e:
        if os.environ.get("KERNELFLEET_DEBUG"):
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
