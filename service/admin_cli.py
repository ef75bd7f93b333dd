"""``kernelfleet admin ...``: enrollment tokens, workers, campaigns and jobs, over the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kernelfleet.service.client import DEFAULT_COORDINATOR, AdminClient, ClientError, resolve_admin_token
from kernelfleet.worker.plural import plural

out = Console()
err = Console(stderr=True, soft_wrap=True)

admin_app = typer.Typer(help="Administer a coordinator: enrollment tokens, workers, campaigns, jobs.",
                        no_args_is_help=True)
workers_app = typer.Typer(help="List and revoke workers.", no_args_is_help=True)
campaign_app = typer.Typer(help="Create and list tuning campaigns.", no_args_is_help=True)
jobs_app = typer.Typer(help="List jobs and their states.", no_args_is_help=True)
admin_app.add_typer(workers_app, name="workers")
admin_app.add_typer(campaign_app, name="campaign")
admin_app.add_typer(jobs_app, name="jobs")

Coordinator = Annotated[str, typer.Option("--coordinator", envvar="KERNELFLEET_COORDINATOR",
                                          help="Coordinator base URL")]
AdminToken = Annotated[str | None, typer.Option(
    "--admin-token", show_default=False,
    help="Admin token (default: KERNELFLEET_ADMIN_TOKEN, or local mode's generated token)")]


def _call(coordinator: str, token: str | None, method: str, path: str, **kw: Any) -> Any:
    try:
        with AdminClient(coordinator, resolve_admin_token(token)) as client:
            return client.request(method, path, **kw)
    except ClientError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None


def _when(value: str | None) -> str:
    return (value or "-").replace("T", " ")[:19]


@admin_app.command("enroll-token")
def enroll_token(
    ttl: Annotated[float | None, typer.Option("--ttl", help="Seconds until it expires "
                                              "(default: the coordinator's setting)")] = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Mint a short-lived, single-use enrollment token for one new worker."""
    body = {"ttl_seconds": ttl} if ttl is not None else {}
    got = _call(coordinator, admin_token, "POST", "/enroll-tokens", json=body)
    out.print(f"enrollment token (single use, expires {_when(got['expires_at'])} UTC):", highlight=False)
    out.print(got["token"], highlight=False, soft_wrap=True)
    out.print(f"on the worker: kernelfleet worker --coordinator {coordinator} --enroll-token {got['token']}",
              highlight=False, soft_wrap=True)


@workers_app.command("list")
def workers_list(coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None) -> None:
    """Every enrolled worker, with its chip, backend and last heartbeat."""
    rows = _call(coordinator, admin_token, "GET", "/workers")
    table = Table(title=plural(len(rows), "worker"))
    for col in ("id", "name", "chip", "backend", "cores", "memory", "mlx", "os", "last heartbeat", "status"):
        table.add_column(col)
    for w in rows:
        mem = f"{w['memory_bytes'] / 2**30:.0f} GiB" if w["memory_bytes"] else "-"
        table.add_row(str(w["id"]), w["name"], w["chip"], w["backend"], str(w["gpu_cores"] or "-"), mem,
                      w["mlx_version"] or "-", w["os"] or "-", _when(w["last_heartbeat_at"]),
                      w.get("status") or ("revoked" if w["revoked_at"] else "-"))
    out.print(table)


@workers_app.command("revoke")
def workers_revoke(worker_id: Annotated[int, typer.Argument(help="The worker's id (see `workers list`)")],
                   coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None) -> None:
    """Revoke a worker's token: its next request is refused."""
    w = _call(coordinator, admin_token, "POST", f"/workers/{worker_id}/revoke")
    out.print(f"worker {w['id']} ({w['name']}) revoked at {_when(w['revoked_at'])} UTC", highlight=False)


def _progress_cells(p: dict[str, int]) -> list[str]:
    return [str(p["total"]), str(p["queued"]), str(p["leased"]), str(p["done"]), str(p["dead"])]


@campaign_app.command("create")
def campaign_create(
    name: Annotated[str, typer.Option("--name", help="A name for the campaign")],
    kernel: Annotated[list[str], typer.Option("--kernel", help="Kernel name; repeat for several")],
    shape: Annotated[list[str], typer.Option("--shape", help="Shape like 4096x4096; repeat for several")],
    dtype: Annotated[list[str], typer.Option("--dtype", help="float32, float16 or bfloat16; repeat")],
    backend: Annotated[str | None, typer.Option("--backend", help="Only metal, cuda or cpu workers")] = None,
    chip: Annotated[str | None, typer.Option("--chip", help="Only chips matching this glob, "
                                             "e.g. 'Apple M3*'")] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts",
                                                     help="Attempts before a job is dead")] = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Create a campaign: one job per kernel x shape x dtype."""
    body: dict[str, Any] = {"name": name, "kernels": kernel, "shapes": shape, "dtypes": dtype}
    if backend is not None:
        body["target_backend"] = backend
    if chip is not None:
        body["target_chip"] = chip
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    c = _call(coordinator, admin_token, "POST", "/campaigns", json=body)
    target = " ".join(x for x in (c["target_backend"], c["target_chip"]) if x) or "any worker"
    jobs = plural(c["progress"]["total"], "job")
    out.print(f"campaign {c['id']} ({c['name']}): {jobs} queued for {target}", highlight=False)


@campaign_app.command("list")
def campaign_list(coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None) -> None:
    """Campaigns with their progress."""
    rows = _call(coordinator, admin_token, "GET", "/campaigns")
    table = Table(title=plural(len(rows), "campaign"))
    for col in ("id", "name", "kernels", "shapes", "dtypes", "target",
                "total", "queued", "leased", "done", "dead"):
        table.add_column(col)
    for c in rows:
        target = " ".join(x for x in (c["target_backend"], c["target_chip"]) if x) or "any"
        table.add_row(str(c["id"]), c["name"], ",".join(c["kernels"]), ",".join(c["shapes"]),
                      ",".join(c["dtypes"]), target, *_progress_cells(c["progress"]))
    out.print(table)


@jobs_app.command("list")
def jobs_list(
    campaign: Annotated[int | None, typer.Option("--campaign", help="Only this campaign's jobs")] = None,
    state: Annotated[str | None, typer.Option("--state", help="queued, leased, done or dead")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows")] = 200,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Jobs with their state, attempts and lease."""
    params: dict[str, Any] = {"limit": limit}
    if campaign is not None:
        params["campaign_id"] = campaign
    if state is not None:
        params["state"] = state
    rows = _call(coordinator, admin_token, "GET", "/jobs", params=params)
    table = Table(title=plural(len(rows), "job"))
    for col in ("id", "campaign", "kernel", "shape", "dtype", "state", "attempts", "worker", "lease expires",
                "last error"):
        table.add_column(col)
    for j in rows:
        table.add_row(str(j["id"]), str(j["campaign_id"] or "-"), j["kernel"], j["shape"], j["dtype"],
                      j["state"],
                      f"{j['attempts']}/{j['max_attempts']}", str(j["leased_by"] or "-"),
                      _when(j["lease_expires_at"]), (j["last_error"] or "")[:60])
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(admin_app, name="admin")
