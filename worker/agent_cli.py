"""``kernelfleet worker``: run the worker agent against a coordinator.

Exit codes: 0 stopped (SIGTERM/SIGINT, or --max-jobs reached), 1 unexpected trouble (message on
stderr), 3 cannot reach a KernelFleet coordinator or not enrolled, 4 enrollment refused or the
worker was revoked.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from kernelfleet.worker.agent import Agent, AgentConfig, JobOutcome, speedup
from kernelfleet.worker.child import ENROLL_TOKEN_ENV
from kernelfleet.worker.client import Lease
from kernelfleet.worker.enrollment import AgentError
from kernelfleet.worker.plural import plural
from kernelfleet.worker.spool import SpoolError
from kernelfleet.worker.state import StateError, WorkerState, default_state_dir

# wide lines when logging to a file or a pipe (a service manager's journal), the terminal's width otherwise
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def _job_line(lease: Lease, outcome: JobOutcome) -> None:
    what = f"job {lease.job_id}  [bold]{lease.kernel}[/] {lease.shape} {lease.dtype}"
    took = f"({outcome.seconds:.1f}s)"
    if outcome.report is not None:
        marks = {"done": "[green]done[/]", "spooled": "[yellow]spooled (coordinator unreachable)[/]",
                 "refused": "[red]refused by the coordinator (quarantined)[/]"}
        mark = marks.get(outcome.status, outcome.status)
        if "entries" in outcome.report:  # a runtime_settings job's chosen settings, per workload
            chosen = "; ".join(
                f"{e['workload']} " + (" ".join(f"{k}={v}" for k, v in sorted(e["settings"].items()))
                                       + f" {e['gain']:.2f}x" if e["settings"] else "MLX defaults")
                for e in outcome.report["entries"])
            console.print(f"{what}  [cyan]{chosen}[/]  {mark} {took}", soft_wrap=True)
            return
        best = outcome.report.get("best_config_key", "?")
        sp = speedup(outcome.report)
        gain = f"{sp:.2f}x vs built-in" if sp is not None else "no built-in to compare"
        console.print(f"{what}  best [cyan]{best}[/]  {gain}  {mark} {took}", soft_wrap=True)
    elif outcome.status == "failed":
        console.print(f"{what}  [red]failed[/]: {outcome.error} {took}", soft_wrap=True)
    elif outcome.status == "released":
        console.print(f"{what}  [yellow]released[/] (stopping; not finished within the grace period) {took}",
                      soft_wrap=True)
    else:
        console.print(f"{what}  [yellow]abandoned[/]: lease lost ({outcome.error}) {took}", soft_wrap=True)


def _setup_logging(verbose: bool) -> None:
    log = logging.getLogger("kernelfleet")
    log.handlers[:] = [RichHandler(console=console, show_path=False, rich_tracebacks=False,
                                   log_time_format="[%X]")]
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False


def _per_gpu(spec: str, forwarded: list[str], state_dir: Path | None, name: str | None,
             enroll_token: str | None) -> int:
    """``--gpus``: one agent per GPU (:mod:`kernelfleet.worker.gpus`); returns the exit code."""
    import socket

    from kernelfleet.worker import gpus

    try:
        devices = gpus.resolve(spec)
    except gpus.GpuSpecError as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
        return 2
    return gpus.run_per_gpu(devices, forwarded, state_dir or default_state_dir(),
                            name or socket.gethostname(), enroll_token)


def worker(
    coordinator: Annotated[str, typer.Option("--coordinator", envvar="KERNELFLEET_COORDINATOR",
                                             help="The coordinator's URL, e.g. http://10.0.0.5:8600")],
    enroll_token: Annotated[str | None, typer.Option(
        "--enroll-token", envvar=ENROLL_TOKEN_ENV,
        help="One-time enrollment token (`kernelfleet admin enroll-token`); needed on the first run only"),
    ] = None,
    max_jobs: Annotated[int | None, typer.Option("--max-jobs", min=1, help="Exit after this many jobs")
                        ] = None,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="Where the worker keeps its token and spool [default: user data dir/worker]"),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name shown in the fleet [default: hostname]")
                    ] = None,
    strategy: Annotated[str, typer.Option("--strategy", help="Search strategy for every job")] = "halving",
    budget: Annotated[float | None, typer.Option(
        "--budget", min=0.001, help="Seconds of measurement per job [default: the strategy's; a "
        "runtime-settings job's search: 900]")] = None,
    grace_seconds: Annotated[float, typer.Option(
        "--grace-seconds", min=0.0,
        help="On SIGTERM, finish the current job within this time, else release it")
    ] = 30.0,
    poll_seconds: Annotated[float, typer.Option(
        "--poll-seconds", min=0.05,
        help="Wait between lease attempts when nothing is queued and the coordinator gives no Retry-After")
    ] = 5.0,
    lease_wait: Annotated[float, typer.Option(
        "--lease-wait", min=0.0, help="How long a lease request waits on the coordinator for work "
                                      "(long-poll; the coordinator caps it)")] = 10.0,
    backoff_max: Annotated[float, typer.Option(
        "--backoff-max", min=0.1, help="Longest wait between retries while the coordinator is unreachable")
    ] = 30.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every request")] = False,
    gpus: Annotated[str | None, typer.Option(
        "--gpus", help="One agent per GPU of this host: 'all' or indices such as 0,1 (each with "
                       "CUDA_VISIBLE_DEVICES set; state in <state dir>/gpu<i>; the enrollment token must "
                       "enroll that many workers: `kernelfleet admin add-worker --gpus N`)")] = None,
) -> None:
    """Run a worker agent: enroll (first run), then lease, tune and report jobs until stopped."""
    _setup_logging(verbose)
    from kernelfleet.worker.search.registry import strategy_names

    if strategy not in strategy_names():  # checked here, or every job it leases would fail
        console.print(f"[bold red]error:[/] unknown search strategy {strategy!r}; choose one of: "
                      f"{', '.join(strategy_names())}")
        raise typer.Exit(2)
    if gpus is not None:
        forwarded = ["--coordinator", coordinator, "--strategy", strategy,
                     "--grace-seconds", str(grace_seconds), "--poll-seconds", str(poll_seconds),
                     "--lease-wait", str(lease_wait),
                     "--backoff-max", str(backoff_max), *(["--max-jobs", str(max_jobs)] if max_jobs else []),
                     *(["--budget", str(budget)] if budget else []), *(["--verbose"] if verbose else [])]
        raise typer.Exit(_per_gpu(gpus, forwarded, state_dir, name, enroll_token))
    try:
        state = WorkerState(state_dir or default_state_dir())
        state.lock()
        agent = Agent(AgentConfig(
            coordinator=coordinator, state=state, enroll_token=enroll_token, name=name, max_jobs=max_jobs,
            strategy=strategy, budget=budget, grace_seconds=grace_seconds, poll_seconds=poll_seconds,
            lease_wait_seconds=lease_wait, backoff_max=backoff_max), on_job=_job_line)
    except (StateError, SpoolError, AgentError) as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
        raise typer.Exit(1) from e

    signals_seen = 0

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        first = signals_seen == 1
        console.print(f"[yellow]{signal.Signals(signum).name}[/]: "
                      + (f"stopping; the current job gets up to {grace_seconds:g}s to finish" if first
                         else "stopping now; giving the current job back"))
        agent.request_stop(immediate=not first)
        agent.abandon_poll()  # idle, waiting on a lease poll: stop now, not when it answers

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    console.print(f"KernelFleet worker: coordinator {coordinator}, state in {state.root}", soft_wrap=True)
    try:
        agent.run()
    except AgentError as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
        raise typer.Exit(e.exit_code) from e
    except (StateError, SpoolError) as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
        raise typer.Exit(1) from e
    console.print(f"worker stopped after {plural(agent.jobs_run, 'job')}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("worker")(worker)
