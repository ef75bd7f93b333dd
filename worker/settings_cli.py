"""``kernelfleet settings``: tune MLX's own runtime settings on this machine, and show them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from kernelfleet.console import stdout_console

USAGE_ERROR = 2
WORKLOADS = ["prefill:2048", "decode:1", "decode:8"]

out_console = stdout_console()
err_console = Console(stderr=True, soft_wrap=True)
settings_app = typer.Typer(help="MLX's own runtime settings (command-buffer / CUDA-graph size, eval width), "
                                "tuned on this machine against its defaults.", no_args_is_help=True)


def _fail(message: str, code: int = USAGE_ERROR) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _interval(e: dict[str, Any]) -> str:
    iv = e.get("interval")
    return f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "—"


def entries_table(body: dict[str, Any], title: str) -> Table:
    table = Table(title=f"{title}: {body.get('chip')} ({body.get('backend')}, mlx {body.get('mlx_version')})")
    for col in ("model", "dtype", "workload", "settings", "gain", "95 % interval", "control", "logits",
                "note"):
        table.add_column(col, justify="right" if col == "gain" else "left")
    for e in body.get("entries", []):
        line = " ".join(f"{k}={v}" for k, v in sorted(e["settings"].items())) or "MLX defaults"
        ctl = e.get("control")
        control = f"{ctl['gain']:.3f}x {_interval(ctl)}" if ctl else "—"
        same = {True: "bit-identical", False: "DIFFER", None: "—"}[e.get("bit_identical")]
        table.add_row(e["model"], e["dtype"], e["workload"], line, f"{e.get('gain', 1.0):.3f}x", _interval(e),
                      control, same, e.get("note") or "")
    return table


def default_path(chip: str) -> Path:
    from kernelfleet.runtime_settings_file import installed_path

    return installed_path(chip)


@settings_app.command("tune")
def tune_command(
    model: Path = typer.Option(..., "--model",
                               help="a model's config.json (e.g. tests/data/models/llama-3-8b.json)"),
    dtype: str = typer.Option("bf16", "--dtype",
                              help="bf16, 4bit or 8bit (quantized as mlx_lm.convert does)"),
    workload: list[str] = typer.Option(WORKLOADS, "--workload",
                                       help="prefill:TOKENS or decode:BATCH (repeat); default prefill:2048, "
                                            "decode:1, decode:8"),
    layers: int = typer.Option(0, "--layers", help="decoder layers built (0: the config's)"),
    compute_dtype: str = typer.Option("bfloat16", "--compute-dtype",
                                      help="the activations' dtype (float32 for MoE models on MLX's CPU)"),
    context: int = typer.Option(512, "--context", help="tokens in the KV cache before decode steps"),
    steps: int = typer.Option(64, "--steps", help="decode steps timed per measurement"),
    reps: int = typer.Option(3, "--reps",
                             help="measurements per process (their median is the process's time)"),
    rounds: int = typer.Option(5, "--rounds", min=3,
                               help="rounds per stage (each side one fresh process a round; at least 3)"),
    budget: float = typer.Option(900.0, "--budget", help="seconds: no round starts that would end past it"),
    knob: list[str] = typer.Option([], "--knob", help="only these environment variables' knobs (repeat)"),
    out: Path | None = typer.Option(None, "--out", help="the runtime-settings file to add the results to "
                                    "(default: <profile dir>/<chip>.settings.json)"),
) -> None:
    """Search MLX's runtime settings for one model on this machine, against MLX's defaults.

    Each setting runs in a fresh process, by turns with the defaults and a control; a setting is
    chosen per workload only if faster beyond the noise with bit-identical logits.
    """
    import mlx.core as mx

    from kernelfleet import runtime_settings_file as settings_file
    from kernelfleet.kernels.patch.model_build import load_config, parse_dtype
    from kernelfleet.kernels.patch.model_shapes import ARCHITECTURES
    from kernelfleet.worker.runtime_settings.job import local_knobs, run
    from kernelfleet.worker.runtime_settings.search import Objective
    from kernelfleet.worker.runtime_settings.sides import StepError
    from kernelfleet.worker.runtime_settings.step import parse_workload

    try:
        config = load_config(model, layers)
        quant = parse_dtype(dtype)
        for w in workload:
            parse_workload(w)
        if config.get("model_type") not in ARCHITECTURES:
            raise ValueError(f"model_type {config.get('model_type')!r} is not one of "
                             f"{', '.join(sorted(ARCHITECTURES))}")
        if not hasattr(mx, compute_dtype):
            raise ValueError(f"--compute-dtype {compute_dtype!r} is no MLX dtype")
    except OSError as e:
        raise _fail(f"--model {model}: {e.strerror or e}") from e
    except (ValueError, KeyError) as e:
        raise _fail(str(e)) from e
    backend, mlx_version, table, why = local_knobs(knob)
    if not table:
        raise _fail(f"--knob {', '.join(knob)}: none of this backend's knobs ({backend}); "
                    "see docs/runtime_settings.md" if knob else why)
    objective = Objective(config, compute_dtype, quant, tuple(workload), context, steps, reps)
    err_console.print(f"tuning {settings_file.shape_key(config)} {objective.label} at {', '.join(workload)}: "
                      f"{len(table)} knobs on {backend} (mlx {mlx_version}), budget {budget:.0f} s")
    try:
        found = run(objective, table, budget_s=budget, rounds=rounds,
                    log=lambda line: err_console.print(line, highlight=False))
    except StepError as e:
        raise _fail(str(e), 1) from e
    path = out or default_path(found["chip"])
    try:
        body = settings_file.read(path) if path.exists() else {"schema": settings_file.SCHEMA, "entries": []}
    except settings_file.SettingsFileError as e:
        raise _fail(str(e)) from e
    new = found.pop("entries")
    body.update(found)
    settings_file.write(settings_file.merge(body, new), path)
    out_console.print(entries_table({**body, "entries": new}, "chosen runtime settings"))
    err_console.print(f"wrote {path}")


@settings_app.command("show")
def show_command(
    file: Path | None = typer.Argument(None, help="a runtime-settings file"),
    chip: str | None = typer.Option(None, "--chip", help="the file `settings tune` wrote for this chip"),
) -> None:
    """Print a runtime-settings file: per model, dtype and workload, the chosen settings and their gain."""
    from kernelfleet import runtime_settings_file as settings_file

    if (file is None) == (chip is None):
        raise _fail("give a FILE or --chip NAME")
    path = file or default_path(chip or "")
    try:
        body = settings_file.read(path)
    except settings_file.SettingsFileError as e:
        raise _fail(str(e)) from e
    out_console.print(entries_table(body, "runtime settings"))


@settings_app.command("push")
def push_command(
    file: Path | None = typer.Argument(None, help="a runtime-settings file [default: this chip's, as "
                                       "`settings tune` wrote it]", show_default=False),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="the enrolled worker's state directory "
                                          "(its token and coordinator) [default: user data dir/worker]"),
    coordinator: str | None = typer.Option(None, "--coordinator", envvar="KERNELFLEET_COORDINATOR",
                                           help="the coordinator's URL [default: the one the worker enrolled "
                                                "with]", show_default=False),
) -> None:
    """Send this machine's chosen runtime settings to the coordinator, as its enrolled worker: the
    fleet then serves them to `kernelfleet pull` on every machine with this chip."""
    import httpx

    from kernelfleet import runtime_settings_file as settings_file
    from kernelfleet.chips import detect_chip
    from kernelfleet.worker.coordinator_url import (
        BadCoordinatorUrl,
        answer_detail,
        coordinator_base,
        unreachable_message,
    )
    from kernelfleet.worker.state import StateError, WorkerState, default_state_dir

    path = file or default_path(detect_chip().name)
    try:
        body = settings_file.read(path)
        creds = WorkerState(state_dir or default_state_dir()).load_credentials()
    except (settings_file.SettingsFileError, StateError) as e:
        raise _fail(str(e)) from e
    if creds is None:
        raise _fail("this machine has no enrolled worker here: enroll it first (`kernelfleet worker "
                    "--coordinator URL --enroll-token TOKEN`), or pass --state-dir")
    url = coordinator or creds.coordinator
    if not url:
        raise _fail("no coordinator URL: pass --coordinator")
    try:
        base = coordinator_base(url)
    except BadCoordinatorUrl as e:
        raise _fail(str(e)) from e
    try:
        r = httpx.post(f"{base}/api/v1/runtime-settings", json=body, timeout=30.0,
                       headers={"Authorization": f"Bearer {creds.token}"})
    except httpx.HTTPError as e:
        raise _fail(unreachable_message(base, e), 1) from e
    if r.status_code != 201:
        raise _fail(f"the coordinator refused the settings: HTTP {r.status_code}: {answer_detail(r)}", 1)
    got = r.json()
    out_console.print(f"pushed {got['stored']} runtime-settings entries for {got['chip']} (mlx "
                      f"{got['mlx_version']}) to {base}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(settings_app, name="settings")
