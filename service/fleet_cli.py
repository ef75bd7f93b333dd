"""``kernelfleet admin tokens ...`` (scoped API tokens) and ``kernelfleet admin add-worker`` (the
commands that install and enroll a new machine), on the ``admin`` app of :mod:`.admin_cli`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kernelfleet.service.admin_cli import (
    AdminToken,
    AsJson,
    Coordinator,
    _call,
    _print_rows,
    _when,
    admin_app,
    err,
    out,
)
from kernelfleet.service.client import DEFAULT_COORDINATOR
from kernelfleet.worker.plural import plural

tokens_app = typer.Typer(help="Create, list and revoke API tokens (scopes: admin, read, enroll).",
                         no_args_is_help=True)
admin_app.add_typer(tokens_app, name="tokens")


@admin_app.command("add-worker")
def add_worker(
    gpus: Annotated[int, typer.Option("--gpus", min=1, max=64, help="Agents the new host runs, one per GPU "
                                      "(the token enrolls that many workers)")] = 1,
    ttl: Annotated[float | None, typer.Option("--ttl", min=1, help="Seconds until the token expires "
                                              "(default: the coordinator's setting)")] = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Print the commands that install KernelFleet on a new Mac (Metal) or Linux GPU host (CUDA) and
    enroll it, with a fresh enrollment token (an admin or enroll token may ask)."""
    body: dict[str, Any] = {"gpus": gpus} | ({"ttl_seconds": ttl} if ttl is not None else {})
    got = _call(coordinator, admin_token, "POST", "/workers/add", json=body)
    each = "one worker" if got["uses"] == 1 else f"{got['uses']} workers"
    out.print(f"enrollment token for {each}, expires {_when(got['expires_at'])} UTC; installs from "
              f"{got['wheel_url']}", highlight=False, soft_wrap=True)
    for platform in got["platforms"]:
        out.print(f"\n[bold]{platform['title']}[/]", highlight=False)
        for step in platform["steps"]:  # markup=False: `kernelfleet[cuda]` is not a style
            out.print(f"  # {step['what']}\n  {step['command']}", markup=False, highlight=False,
                      soft_wrap=True)
        for step in platform["alternatives"]:
            out.print(f"  # {step['what']}:\n  #   {step['command']}", markup=False, highlight=False,
                      soft_wrap=True)
    for note in got["notes"]:
        err.print(f"\nnote: {note}", markup=False, highlight=False)


SCOPES = ("admin", "read", "enroll")


@tokens_app.command("create")
def tokens_create(
    name: Annotated[str, typer.Option("--name", help="What it is for, e.g. 'macs in the lab'")],
    scope: Annotated[str, typer.Option(
        "--scope", help="read: the dashboard and `kernelfleet pull`; enroll: mint enrollment tokens "
                        "(Add a worker); admin: everything")] = "read",
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Create an API token; it is shown only this once (the coordinator keeps its SHA-256 digest)."""
    if scope not in SCOPES:
        err.print(f"[bold red]error:[/] --scope {scope!r}: choose one of {', '.join(SCOPES)}",
                  highlight=False)
        raise typer.Exit(2)
    got = _call(coordinator, admin_token, "POST", "/tokens", json={"name": name, "scope": scope})
    out.print(f"{scope} token {got['id']} ({got['name']}), shown only this once:", highlight=False)
    out.print(got["token"], highlight=False, soft_wrap=True)
    use = {"read": f"kernelfleet pull --coordinator {coordinator} --token TOKEN (or KERNELFLEET_TOKEN); "
                   f"the dashboard's sign-in page takes it too",
           "enroll": f"kernelfleet admin add-worker --coordinator {coordinator} --admin-token TOKEN",
           "admin": "any `kernelfleet admin` command: --admin-token TOKEN (or KERNELFLEET_ADMIN_TOKEN)",
           }[scope]
    out.print(f"use: {use}", highlight=False, soft_wrap=True)


@tokens_app.command("list")
def tokens_list(coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
                as_json: AsJson = False) -> None:
    """Every API token (never the token itself), with its scope and whether it is revoked."""
    rows = _call(coordinator, admin_token, "GET", "/tokens")
    _print_rows(rows, as_json, plural(len(rows), "token"), ("id", "name", "scope", "created", "revoked"),
                lambda t: [str(t["id"]), t["name"], t["scope"], _when(t["created_at"]),
                           _when(t["revoked_at"])])


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[int, typer.Argument(help="The token's id (see `tokens list`)")],
                  coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None) -> None:
    """Revoke an API token: every later request with it is refused (401)."""
    t = _call(coordinator, admin_token, "POST", f"/tokens/{token_id}/revoke")
    out.print(f"{t['scope']} token {t['id']} ({t['name']}) revoked at {_when(t['revoked_at'])} UTC",
              highlight=False)
