"""Coordinator commands: ``serve``, ``db upgrade``, plus ``admin ...`` and ``import`` (HTTP clients)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
import uvicorn
from rich.console import Console

from kernelfleet.console import stdout_console
from kernelfleet.service import admin_cli, import_cli
from kernelfleet.service.serve_checks import (
    PortInUse,
    check_port_free,
    freeze_start_up_objects,
    quiet_idle_polls,
)
from kernelfleet.service.settings import Settings

if TYPE_CHECKING:
    from kernelfleet.service.local_worker import LocalWorker
    from kernelfleet.service.longpoll import LeaseWaiters

err = Console(stderr=True, soft_wrap=True)
out = stdout_console()
logger = logging.getLogger(__name__)

# idle keep-alive connections stay open this long (uvicorn's default is 5 s): longer than a load
# balancer's or client's own idle timeout, so they, not the server, close an idle connection (a
# server closing one just as the peer reuses it fails that request: measured with 10,000 workers)
KEEP_ALIVE = 75
# with --workers, uvicorn pings each process and replaces one that does not answer in this long
# (its default, 5 s): a process answers only once it has imported the app, which took over 5 s on a
# loaded 2-core host, so every replacement was killed in turn and the server never came up (CI)
WORKER_HEALTHCHECK_SECONDS = 60

db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)

DatabaseUrl = Annotated[str | None, typer.Option(
    "--database-url",
    help="Database URL (default: KERNELFLEET_DATABASE_URL, else a SQLite file in the user's data directory)")]


def _settings(**overrides: object) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


class _Server(uvicorn.Server):
    """uvicorn's server, which also tells the local worker to stop as soon as an exit signal arrives,
    and ends the long-polled lease requests then (their workers get 204 at once, rather than holding
    the graceful shutdown for the rest of their wait).

    uvicorn re-raises SIGTERM after its graceful shutdown, so a ``finally`` after ``run()`` may never
    run; stopping the worker from the signal handler lets it release or post its job while the
    API still answers.
    """

    def __init__(self, config: uvicorn.Config, worker: LocalWorker | None, waiters: LeaseWaiters) -> None:
        super().__init__(config)
        self.local_worker = worker
        self.lease_waiters = waiters

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.local_worker is not None:
            self.local_worker.request_stop()
        self.lease_waiters.stop_waiting()
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def _background_process(settings: Settings, log_level: str) -> Iterator[None]:
    """The background loop (reactions, profiles, campaign sweep, alerts) in one process of its own
    beside the server process(es), which then only serve requests (and reap)."""
    from kernelfleet.service import background

    try:
        process = background.start_process(settings, log_level)
    except RuntimeError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    try:
        yield
    finally:  # also when uvicorn re-raises SIGTERM the process sees us gone and stops by itself
        background.stop_process(process)


def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind "
                                             "(default KERNELFLEET_HOST or 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default KERNELFLEET_PORT or 8600)")] = None,
    public_url: Annotated[str | None, typer.Option(
        help="The address users and workers reach this coordinator at, shown in the dashboard's pull "
             "commands (default KERNELFLEET_PUBLIC_URL, else http://HOST:PORT)")] = None,
    database_url: DatabaseUrl = None,
    local_worker: Annotated[bool, typer.Option("--local-worker", help="Also run one worker agent on this "
                                               "machine, enrolled automatically")] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    workers: Annotated[int, typer.Option(
        "--workers", min=1, help="Server processes on this port (uvicorn workers); serve also starts one "
                                 "background process for queued and periodic work (docs/production.md)")] = 1,
) -> None:
    """Run the coordinator (API under /api/v1, docs under /docs, health at /healthz, metrics at /metrics)."""
    from sqlalchemy.exc import SQLAlchemyError  # here, not when every kernelfleet command starts

    from kernelfleet.service.app import create_app
    from kernelfleet.service.local_admin import admin_token_path, ensure_admin_token
    from kernelfleet.service.migrate import SchemaNotCurrent

    settings = _settings(host=host, port=port, database_url=database_url, public_url=public_url)
    settings.background_in_server = False  # _background_process runs it
    if workers > 1 and local_worker:
        err.print("[bold red]error:[/] --local-worker runs in the server process: use it with --workers 1")
        raise typer.Exit(2)
    try:
        check_port_free(settings.host, settings.port)
    except PortInUse as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    try:
        app = create_app(settings)
    except SchemaNotCurrent as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    except SQLAlchemyError as e:
        where = settings.database_url.split("@")[-1]
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        err.print(f"[bold red]error:[/] cannot open the database ({where}): {reason}", highlight=False)
        raise typer.Exit(1) from None
    token, generated = ensure_admin_token(settings)
    settings.admin_token = token
    if generated:
        out.print(f"Generated an admin token (kept in {admin_token_path(settings)}, mode 0600; "
                  f"shown only this once):\n  {token}", highlight=False, soft_wrap=True)
    elif token is None:
        err.print("[yellow]warning:[/] no KERNELFLEET_ADMIN_TOKEN is set: admin routes refuse every request")
    if settings.host in ("0.0.0.0", "::", "") and not settings.public_url:
        err.print(f"[yellow]warning:[/] serving on every address, but the dashboard's Add a worker and pull "
                  f"commands name {settings.local_url}, which other machines cannot reach: set --public-url "
                  f"(KERNELFLEET_PUBLIC_URL; `make run PUBLIC_URL=...`) to this machine's address",
                  highlight=False)
    if workers > 1:
        app.state.engine.dispose()  # built only to check the database; each process builds its own
        with _background_process(settings, log_level):
            _serve_processes(settings, workers, log_level)
        return
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                            proxy_headers=True, timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE)
    quiet_idle_polls()  # after uvicorn.Config, which configures its loggers
    worker = None
    if local_worker:
        from kernelfleet.service.local_worker import LocalWorker  # the ORM: not for every command

        worker = LocalWorker(app.state.session_factory, settings.local_url,
                             settings.resolved_data_dir())
    server = _Server(config, worker, app.state.lease_waiters)
    freeze_start_up_objects()
    if worker is not None:
        worker.start()
    out.print(f"KernelFleet dashboard at {settings.resolved_public_url}/ (API {settings.resolved_public_url}"
              f"/api/v1, docs /docs); Ctrl-C stops it", highlight=False, soft_wrap=True)
    try:
        with _background_process(settings, log_level):
            server.run()
    finally:
        if worker is not None:
            worker.stop()
    if not server.started:
        raise typer.Exit(1)


def _serve_processes(settings: Settings, workers: int, log_level: str) -> None:
    """``workers`` uvicorn processes on one socket; each builds its app from the environment
    (:func:`kernelfleet.service.app.app_from_env`), so this process passes its settings on there."""
    os.environ["KERNELFLEET_DATABASE_URL"] = settings.database_url
    os.environ["KERNELFLEET_BACKGROUND_IN_SERVER"] = "false"  # serve's background process runs it
    if settings.admin_token:
        os.environ["KERNELFLEET_ADMIN_TOKEN"] = settings.admin_token
    if settings.public_url:
        os.environ["KERNELFLEET_PUBLIC_URL"] = str(settings.public_url)
    # /metrics adds up every process's samples (prometheus_client's multiprocess mode): a fresh
    # directory for them, or the configured one emptied, before the processes start
    metrics_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if metrics_dir:
        for stale in Path(metrics_dir).glob("*.db"):
            stale.unlink()
    else:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="kernelfleet-metrics-")
    uvicorn.run("kernelfleet.service.app:app_from_env", factory=True, workers=workers, host=settings.host,
                port=settings.port, log_level=log_level, proxy_headers=True, timeout_graceful_shutdown=10,
                timeout_keep_alive=KEEP_ALIVE, timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS)


def demo(
    reports: Annotated[list[Path] | None, typer.Argument(
        help="Tuning reports (JSONL) to show [default: benchmarks/results/*_tuning.jsonl here]",
        show_default=False)] = None,
    database_url: Annotated[str | None, typer.Option(
        "--database-url", help="[default: a SQLite file of its own, <user data dir>/kernelfleet/demo]",
        show_default=False)] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8600)")] = None,
    local_worker: Annotated[bool, typer.Option(
        "--local-worker/--no-local-worker", help="Run the local worker that tunes this machine's CPU"),
    ] = True,
) -> None:
    """Serve the shipped GPU reports (NVIDIA H100, H200) beside this machine's CPU (`make demo`).

    On a database of its own: what tuning does on a GPU, without one."""
    from sqlalchemy.exc import SQLAlchemyError  # here, not when every kernelfleet command starts

    from kernelfleet.service import demo as demo_fill
    from kernelfleet.service.import_cli import BadReportFile
    from kernelfleet.service.local_admin import admin_token_path
    from kernelfleet.service.migrate import upgrade
    from kernelfleet.service.settings import default_data_dir

    try:
        loaded = demo_fill.load(reports or demo_fill.default_reports(Path.cwd()))
    except BadReportFile as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    url = database_url or f"sqlite:///{default_data_dir() / 'demo' / 'kernelfleet.db'}"
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        upgrade(url)
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        err.print(f"[bold red]error:[/] cannot set up the demo database: {reason}", highlight=False)
        raise typer.Exit(1) from None
    settings = _settings(host=host, port=port, database_url=url)

    def token() -> str | None:
        if settings.admin_token:
            return settings.admin_token
        path = admin_token_path(settings)
        return path.read_text().strip() if path.exists() else None

    demo_fill.fill_when_up(settings.local_url, token, loaded,
                           lambda line: out.print(line, highlight=False, soft_wrap=True))
    serve(host=host, port=port, public_url=None, database_url=url, local_worker=local_worker)


@db_app.command("upgrade")
def db_upgrade(database_url: DatabaseUrl = None) -> None:
    """Create or upgrade the schema to the newest revision."""
    from sqlalchemy.exc import SQLAlchemyError  # here, not when every kernelfleet command starts

    from kernelfleet.service.db import make_engine
    from kernelfleet.service.migrate import current_revision, head_revision, upgrade

    url = _settings(database_url=database_url).database_url
    try:
        upgrade(url)
        engine = make_engine(url)
        try:
            rev = current_revision(engine)
        finally:
            engine.dispose()
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        err.print(f"[bold red]error:[/] cannot upgrade the database: {reason}", highlight=False)
        raise typer.Exit(1) from None
    out.print(f"database at revision {rev} (head {head_revision(url)})")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("demo")(demo)
    app.add_typer(db_app, name="db")
    admin_cli.register(app)
    import_cli.register(app)
