"""``kernelfleet import results.jsonl``: send tuning reports made with ``kernelfleet tune --out`` to a
coordinator. Every line is checked first; a bad line is named by its number and nothing is sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress

from kernelfleet.console import stdout_console
from kernelfleet.service.client import DEFAULT_COORDINATOR, AdminClient, ClientError, resolve_admin_token
from kernelfleet.worker.plural import plural

out = stdout_console()
err = Console(stderr=True, soft_wrap=True)
BATCH_BYTES = 2 * 1024 * 1024


class BadReportFile(Exception):
    pass


def read_reports(path: Path) -> list[dict[str, Any]]:
    """Parse and validate every line; raise :class:`BadReportFile` naming each bad line."""
    # the API's schemas, loaded here and not when the CLI starts (every kernelfleet command loads this module)
    from pydantic import ValidationError

    from kernelfleet.service.limits import describe_validation_errors
    from kernelfleet.service.schemas import TuningReport

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadReportFile(f"cannot read {path}: {e}") from e
    reports: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{path.name} line {number}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        try:
            reports.append(TuningReport.model_validate(data).model_dump(mode="json"))
        except ValidationError as e:
            problems.append(f"{path.name} line {number}: not a valid tuning report: "
                            f"{describe_validation_errors(e.errors())}")
    if problems:
        shown = problems[:10]
        if len(problems) > 10:
            shown.append(f"... and {len(problems) - 10} more bad lines")
        raise BadReportFile("\n".join(shown) + "\nnothing was imported")
    if not reports:
        raise BadReportFile(f"{path} has no reports (expected one JSON tuning report per line)")
    return reports


def _batches(reports: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    batches: list[list[dict[str, Any]]] = [[]]
    size = 0
    for r in reports:
        n = len(json.dumps(r))
        if batches[-1] and (size + n > BATCH_BYTES or len(batches[-1]) >= 1000):
            batches.append([])
            size = 0
        batches[-1].append(r)
        size += n
    return batches


def import_command(
    path: Annotated[Path, typer.Argument(help="A JSONL file: one tuning report per line")],
    coordinator: Annotated[str, typer.Option("--coordinator", envvar="KERNELFLEET_COORDINATOR",
                                             help="Coordinator base URL")] = DEFAULT_COORDINATOR,
    admin_token: Annotated[str | None, typer.Option("--admin-token", help="Admin token (default: "
                                                    "KERNELFLEET_ADMIN_TOKEN)", show_default=False)] = None,
) -> None:
    """Import tuning reports (from `kernelfleet tune --out`) into a coordinator."""
    try:
        reports = read_reports(path)
        token = resolve_admin_token(admin_token)
        imported = duplicates = 0
        with AdminClient(coordinator, token) as client, Progress(console=err, transient=True) as bar:
            task = bar.add_task("importing", total=len(reports))
            for batch in _batches(reports):
                got = client.request("POST", "/results/import", json={"reports": batch})
                imported += int(got["imported"])
                duplicates += int(got.get("duplicates", 0))
                bar.advance(task, len(batch))
    except (BadReportFile, ClientError) as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    again = f" ({plural(duplicates, 'report')} already imported before: not stored twice)"
    again = again if duplicates else ""
    out.print(f"imported {plural(imported, 'report')} from {path} into {coordinator}{again}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("import")(import_command)
