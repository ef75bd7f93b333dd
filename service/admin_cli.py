"""``kernelfleet admin ...``: enrollment tokens, workers, campaigns, jobs, regressions and webhook
deliveries, over the HTTP API. Every ``list`` command takes ``--json`` (the API's JSON, unchanged)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelfleet.console import stdout_console
from kernelfleet.service.client import DEFAULT_COORDINATOR, AdminClient, ClientError, resolve_admin_token
from kernelfleet.worker.plural import plural

out = stdout_console()
err = Console(stderr=True, soft_wrap=True)

admin_app = typer.Typer(help="Administer a coordinator: tokens, adding workers, workers, campaigns, jobs.",
                        no_args_is_help=True)
workers_app = typer.Typer(help="List and revoke workers.", no_args_is_help=True)
campaign_app = typer.Typer(help="Create and list tuning campaigns.", no_args_is_help=True)
jobs_app = typer.Typer(help="List jobs and their states.", no_args_is_help=True)
admin_app.add_typer(workers_app, name="workers")
admin_app.add_typer(campaign_app, name="campaign")
admin_app.add_typer(jobs_app, name="jobs")
regressions_app = typer.Typer(help="List and triage regressions: acknowledge, mark, group, history, "
                              "per-series thresholds.", no_args_is_help=True)
threshold_app = typer.Typer(help="A series' own minimum effect (instead of the coordinator's "
                            "KERNELFLEET_REGRESSION_MIN_EFFECT).", no_args_is_help=True)
regressions_app.add_typer(threshold_app, name="threshold")
webhooks_app = typer.Typer(help="Webhook alert deliveries and their attempts.", no_args_is_help=True)
admin_app.add_typer(regressions_app, name="regressions")
admin_app.add_typer(webhooks_app, name="webhooks")

Coordinator = Annotated[str, typer.Option("--coordinator", envvar="KERNELFLEET_COORDINATOR",
                                          help="Coordinator base URL")]
AdminToken = Annotated[str | None, typer.Option(
    "--admin-token", show_default=False,
    help="Admin token (default: KERNELFLEET_ADMIN_TOKEN, or local mode's generated token)")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the rows as JSON (as the API returns them)")]


def _print_json(rows: Any) -> None:
    print(json.dumps(rows, indent=2))


def _print_rows(rows: list[dict[str, Any]], as_json: bool, title: str, columns: Sequence[str],
                cells: Callable[[dict[str, Any]], Sequence[str]]) -> None:
    """A list command's answer: the rows as JSON (``--json``), else a table of ``cells(row)``."""
    if as_json:
        return _print_json(rows)
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*cells(row))
    out.print(table)


def _call(coordinator: str, token: str | None, method: str, path: str,
          words: dict[str, str] | None = None, **kw: Any) -> Any:
    """The API's answer; on failure one line on stderr (the body's field paths replaced by ``words``,
    e.g. the command's option names) and exit 1."""
    try:
        with AdminClient(coordinator, resolve_admin_token(token)) as client:
            return client.request(method, path, **kw)
    except ClientError as e:
        message = str(e)
        for pattern, option in (words or {}).items():
            message = re.sub(pattern, option, message)
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
        raise typer.Exit(1) from None


# a campaign body's field paths (in the coordinator's 422 messages) as the options that set them
CAMPAIGN_FLAGS = {r"\bkernels(\.\d+)?\b": "--kernel", r"\bshapes(\.\d+)?\b": "--shape",
                  r"\bdtypes(\.\d+)?\b": "--dtype", r"\bkernel_shapes(\.[\w.]+)?": "--kernel-shape",
                  r"\btarget_backend\b": "--backend", r"\btarget_chip\b": "--chip",
                  r"\bmax_attempts\b": "--max-attempts", r"^(.*?)\bname:": r"\1--name:"}


def _when(value: str | None) -> str:
    return (value or "-").replace("T", " ")[:19]


@admin_app.command("enroll-token")
def enroll_token(
    ttl: Annotated[float | None, typer.Option("--ttl", help="Seconds until it expires "
                                              "(default: the coordinator's setting)")] = None,
    uses: Annotated[int, typer.Option("--uses", min=1, max=64, help="Workers it may enroll (one per GPU "
                                      "of a host: `kernelfleet worker --gpus all`)")] = 1,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Mint a short-lived enrollment token for one new worker (or --uses N). `add-worker` prints the
    commands that install and enroll a machine with one."""
    body: dict[str, Any] = {"uses": uses} | ({"ttl_seconds": ttl} if ttl is not None else {})
    got = _call(coordinator, admin_token, "POST", "/enroll-tokens", json=body)
    use = "single use" if uses == 1 else f"enrolls {uses} workers"
    out.print(f"enrollment token ({use}, expires {_when(got['expires_at'])} UTC):", highlight=False)
    out.print(got["token"], highlight=False, soft_wrap=True)
    gpus = " --gpus all" if uses > 1 else ""
    out.print(f"on the worker: kernelfleet worker --coordinator {coordinator} --enroll-token "
              f"{got['token']}{gpus}", highlight=False, soft_wrap=True)
    out.print("(`kernelfleet admin add-worker` prints the commands that install KernelFleet there too, "
              "with the coordinator's public URL)", highlight=False, soft_wrap=True)


@workers_app.command("list")
def workers_list(coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
                 as_json: AsJson = False) -> None:
    """Every enrolled worker, with its chip, backend and last heartbeat."""
    rows = _call(coordinator, admin_token, "GET", "/workers")

    def cells(w: dict[str, Any]) -> list[str]:
        mem = f"{w['memory_bytes'] / 2**30:.0f} GiB" if w["memory_bytes"] else "-"
        return [str(w["id"]), w["name"], w["chip"], w["backend"], str(w["gpu_cores"] or "-"), mem,
                w["mlx_version"] or "-", w["os"] or "-", _when(w["last_heartbeat_at"]),
                w.get("status") or ("revoked" if w["revoked_at"] else "-")]

    _print_rows(rows, as_json, plural(len(rows), "worker"),
                ("id", "name", "chip", "backend", "cores", "memory", "mlx", "os", "last heartbeat", "status"),
                cells)


@workers_app.command("revoke")
def workers_revoke(worker_id: Annotated[int, typer.Argument(help="The worker's id (see `workers list`)")],
                   coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None) -> None:
    """Revoke a worker's token: its next request is refused."""
    w = _call(coordinator, admin_token, "POST", f"/workers/{worker_id}/revoke")
    out.print(f"worker {w['id']} ({w['name']}) revoked at {_when(w['revoked_at'])} UTC", highlight=False)


def _progress_cells(p: dict[str, int]) -> list[str]:
    return [str(p["total"]), str(p["queued"]), str(p["leased"]), str(p["done"]), str(p["dead"]),
            str(p.get("cancelled", 0))]


@campaign_app.command("create")
def campaign_create(
    name: Annotated[str | None, typer.Option("--name", help="A name for the campaign (default with "
                                             "--from-model: the model's type and folder)")] = None,
    kernel: Annotated[list[str] | None, typer.Option(
        "--kernel", help="Kernel name; repeat for several")] = None,
    shape: Annotated[list[str] | None, typer.Option(
        "--shape", help="Shape like 4096x4096, for every --kernel; repeat for several")] = None,
    kernel_shape: Annotated[list[str] | None, typer.Option(
        "--kernel-shape", help="KERNEL=SHAPE, one kernel's own shape (e.g. rope=32x1x128); repeat")] = None,
    from_model: Annotated[Path | None, typer.Option(
        "--from-model", help="A model's config.json (mlx-lm / Hugging Face): every catalog kernel call "
        "it makes, at the --decode and --prefill token counts")] = None,
    decode: Annotated[list[int] | None, typer.Option(
        "--decode", help="With --from-model: decode batch sizes (default 1, 8, 32); repeat")] = None,
    prefill: Annotated[list[int] | None, typer.Option(
        "--prefill", help="With --from-model: prefill lengths (default 512, 2048); repeat")] = None,
    verify: Annotated[list[int] | None, typer.Option(
        "--verify", help="With --from-model, for a quantized model's matmuls: tokens of a speculative "
        "draft-verify call (default 2, 3, 4); repeat")] = None,
    dtype: Annotated[list[str] | None, typer.Option(
        "--dtype", help="float32, float16 or bfloat16; repeat (default with --from-model: the model's)",
    )] = None,
    runtime_settings: Annotated[bool, typer.Option(
        "--runtime-settings", help="With --from-model: also queue the model's runtime-settings jobs, one per "
        "enrolled chip the campaign targets (MLX's runtime knobs searched on that chip's worker, within its "
        "--budget; docs/runtime_settings.md)"
    )] = False,
    runtime_settings_only: Annotated[bool, typer.Option(
        "--runtime-settings-only", help="With --from-model: queue only the runtime-settings jobs")] = False,
    runtime_dtype: Annotated[list[str] | None, typer.Option(
        "--runtime-dtype", help="Runtime settings: bf16, 4bit or 8bit weights, one job each (per chip); "
        "repeat "
        "(default: the model's)")] = None,
    runtime_workload: Annotated[list[str] | None, typer.Option(
        "--runtime-workload", help="Runtime settings: prefill:TOKENS or decode:BATCH; repeat (default "
        "prefill:2048, decode:1, decode:8)")] = None,
    runtime_layers: Annotated[int, typer.Option(
        "--runtime-layers", min=0, help="Runtime settings: decoder layers built (0: the config's)")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; queue nothing")] = False,
    backend: Annotated[str | None, typer.Option("--backend", help="Only metal, cuda or cpu workers")] = None,
    chip: Annotated[str | None, typer.Option("--chip", help="Only chips matching this glob, "
                                             "e.g. 'Apple M3*'")] = None,
    max_attempts: Annotated[int | None, typer.Option("--max-attempts",
                                                     help="Attempts before a job is dead")] = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Create a campaign: one job per kernel x shape x dtype (each kernel with its own shapes with
    --kernel-shape or --from-model), and with --runtime-settings one runtime-settings job per weight
    dtype of the model and enrolled chip the campaign targets. Prints the plan before it queues
    anything."""
    from kernelfleet.service import campaign_plan  # the kernel catalog (numpy, mlx): only when planning

    body: dict[str, Any] = {}
    runtime = runtime_settings or runtime_settings_only
    if runtime_settings_only and (kernel or shape or kernel_shape or dtype or decode or prefill or verify):
        err.print("[bold red]error:[/] --runtime-settings-only queues no kernel jobs: drop --kernel, "
                  "--shape, --kernel-shape, --dtype, --decode, --prefill and --verify", highlight=False)
        raise typer.Exit(1)
    if not runtime and (runtime_dtype or runtime_workload or runtime_layers):
        err.print("[bold red]error:[/] --runtime-dtype, --runtime-workload and --runtime-layers go with "
                  "--runtime-settings", highlight=False)
        raise typer.Exit(1)
    if runtime:
        body["runtime_settings"] = campaign_plan.runtime_settings(
            from_model, quantization=runtime_dtype or [], workload=runtime_workload or [],
            layers=runtime_layers, out=out, err=err)
    if runtime_settings_only:
        name = name or f"runtime settings: {body['runtime_settings']['config'].get('model_type')} " \
                       f"({from_model.resolve().parent.name if from_model else ''})"
    else:
        sets, dtypes, name = campaign_plan.shape_sets(
            kernel=kernel or [], shape=shape or [], kernel_shape=kernel_shape or [], from_model=from_model,
            decode=decode, prefill=prefill, dtype=dtype or [], name=name, out=out, err=err, backend=backend,
            chip=chip, verify=verify)
        body.update(kernel_shapes=sets, dtypes=dtypes)
    body["name"] = name
    if backend is not None:
        body["target_backend"] = backend
    if chip is not None:
        body["target_chip"] = chip
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    if dry_run:
        out.print("dry run: nothing queued", highlight=False)
        return
    c = _call(coordinator, admin_token, "POST", "/campaigns", json=body, words=CAMPAIGN_FLAGS)
    target = " ".join(x for x in (c["target_backend"], c["target_chip"]) if x) or "any worker"
    jobs = plural(c["progress"]["total"], "job")
    out.print(f"campaign {c['id']} ({c['name']}): {jobs} queued for {target}", highlight=False)
    for warning in c.get("warnings", []):
        err.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


@campaign_app.command("list")
def campaign_list(coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
                  as_json: AsJson = False) -> None:
    """Campaigns with their progress."""
    rows = _call(coordinator, admin_token, "GET", "/campaigns")

    def cells(c: dict[str, Any]) -> list[str]:
        target = " ".join(x for x in (c["target_backend"], c["target_chip"]) if x) or "any"
        return [str(c["id"]), c["name"], ",".join(c["kernels"]), ",".join(c["shapes"]),
                ",".join(c["dtypes"]), target, *_progress_cells(c["progress"])]

    _print_rows(rows, as_json, plural(len(rows), "campaign"),
                ("id", "name", "kernels", "shapes", "dtypes", "target",
                 "total", "queued", "leased", "done", "dead", "cancelled"), cells)


@jobs_app.command("list")
def jobs_list(
    campaign: Annotated[int | None, typer.Option("--campaign", help="Only this campaign's jobs")] = None,
    state: Annotated[str | None, typer.Option("--state",
                                              help="queued, leased, done, dead or cancelled")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows")] = 200,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None, as_json: AsJson = False,
) -> None:
    """Jobs with their state, attempts and lease."""
    params: dict[str, Any] = {"limit": limit}
    if campaign is not None:
        params["campaign_id"] = campaign
    if state is not None:
        params["state"] = state
    rows = _call(coordinator, admin_token, "GET", "/jobs", params=params)
    _print_rows(rows, as_json, plural(len(rows), "job"),
                ("id", "campaign", "kernel", "shape", "dtype", "state", "attempts", "worker", "lease expires",
                 "last error"),
                lambda j: [str(j["id"]), str(j["campaign_id"] or "-"), j["kernel"], j["shape"], j["dtype"],
                           j["state"], f"{j['attempts']}/{j['max_attempts']}", str(j["leased_by"] or "-"),
                           _when(j["lease_expires_at"]), (j["last_error"] or "")[:60]])


CampaignId = Annotated[int, typer.Argument(help="The campaign's id (see `campaign list`)")]


def _control(coordinator: str, admin_token: str | None, method: str, path: str) -> None:
    got = _call(coordinator, admin_token, method, path)
    out.print(got["detail"], highlight=False)


@campaign_app.command("cancel")
def campaign_cancel(campaign_id: CampaignId, coordinator: Coordinator = DEFAULT_COORDINATOR,
                    admin_token: AdminToken = None) -> None:
    """Cancel a campaign: its queued jobs are cancelled; running ones finish and keep their results."""
    _control(coordinator, admin_token, "POST", f"/campaigns/{campaign_id}/cancel")


@campaign_app.command("delete")
def campaign_delete(campaign_id: CampaignId, coordinator: Coordinator = DEFAULT_COORDINATOR,
                    admin_token: AdminToken = None) -> None:
    """Delete a campaign: cancel it and remove it once its running jobs finish (results are kept)."""
    _control(coordinator, admin_token, "DELETE", f"/campaigns/{campaign_id}")


@campaign_app.command("retry")
def campaign_retry(campaign_id: CampaignId, coordinator: Coordinator = DEFAULT_COORDINATOR,
                   admin_token: AdminToken = None) -> None:
    """Requeue a campaign's dead jobs and queue again its runs that had no successful trial."""
    _control(coordinator, admin_token, "POST", f"/campaigns/{campaign_id}/retry")


@regressions_app.command("list")
def regressions_list(
    status: Annotated[str | None, typer.Option("--status", help="confirming, open, acknowledged, dismissed, "
                                               "invalid, ignored or fixed")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows")] = 100,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None, as_json: AsJson = False,
) -> None:
    """Regressions, newest first, with their cause."""
    params: dict[str, Any] = {"limit": limit} | ({"status": status} if status else {})
    rows = _call(coordinator, admin_token, "GET", "/regressions", params=params)
    _print_rows(rows, as_json, plural(len(rows), "regression"),
                ("id", "status", "chip", "kernel", "shape", "dtype", "effect", "cause", "detected",
                 "status set by"),
                lambda r: [str(r["id"]), r["status"], r["chip"], r["kernel"], r["shape"], r["dtype"],
                           f"{100 * r['effect']:+.1f}%", r["cause_text"][:60], _when(r["detected_at"]),
                           _changed(r)])


def _changed(r: dict[str, Any]) -> str:
    by = r.get("status_changed_by")
    return f"{by}, {_when(r['status_changed_at'])}" if by else "-"


RegressionId = Annotated[int, typer.Argument(help="The regression's id (see `regressions list`)")]
Note = Annotated[str | None, typer.Option("--note", help="Why (kept with it and in its history)")]


@regressions_app.command("acknowledge")
def regressions_acknowledge(
    regression_id: RegressionId,
    note: Note = None,
    group: Annotated[bool, typer.Option("--group", help="Every open one with the same cause")] = False,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Acknowledge a regression; its queued confirmation job is cancelled."""
    body: dict[str, Any] = {"whole_group": group} | ({"note": note} if note is not None else {})
    got = _call(coordinator, admin_token, "POST", f"/regressions/{regression_id}/acknowledge", json=body)
    ids = ", ".join(str(i) for i in got["acknowledged"]) or "none"
    out.print(f"acknowledged: {ids}" + _cancelled(got.get("cancelled_jobs", [])), highlight=False)


def _cancelled(jobs: list[int]) -> str:
    return f"; confirmation job(s) cancelled: {', '.join(str(j) for j in jobs)}" if jobs else ""


@regressions_app.command("mark")
def regressions_mark(
    regression_id: RegressionId,
    status: Annotated[str, typer.Argument(help="invalid (noise), ignored (expected), fixed (undone later: "
                                          "give --fixed-by-run or --fixed-by-regression) or open (undo)")],
    note: Note = None,
    fixed_by_run: Annotated[int | None, typer.Option(
        "--fixed-by-run", help="With fixed: a later run (result id) of the series showing the fix")] = None,
    fixed_by_regression: Annotated[int | None, typer.Option(
        "--fixed-by-regression", help="With fixed: a later alert of the same series that undid it")] = None,
    group: Annotated[bool, typer.Option("--group", help="Also every other regression with the same cause "
                                        "whose status can move there (not with fixed)")] = False,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Triage a regression: mark it invalid, ignored or fixed, or open again.

    Marking one still being confirmed cancels its confirmation job; who did it and when is kept with it
    and in its history."""
    body: dict[str, Any] = {"status": status, "note": note, "fixed_by_result_id": fixed_by_run,
                            "fixed_by_regression_id": fixed_by_regression, "whole_group": group or None}
    got = _call(coordinator, admin_token, "POST", f"/regressions/{regression_id}/triage",
                json={k: v for k, v in body.items() if v is not None},
                words={r"\bfixed_by_result_id\b": "--fixed-by-run",
                       r"\bfixed_by_regression_id\b": "--fixed-by-regression", r"\bwhole_group\b": "--group"})
    ids, cancelled = ", ".join(str(i) for i in got["changed"]), got["cancelled_jobs"]
    noun = "regression" if len(got["changed"]) == 1 else "regressions"
    out.print(f"{noun} {ids}: {got['status']} (by {got['status_changed_by']})" + _cancelled(cancelled),
              highlight=False)


def _regroup(coordinator: str, admin_token: str | None, regression_id: int, into: int | None,
             note: str | None) -> None:
    got = _call(coordinator, admin_token, "POST", f"/regressions/{regression_id}/group",
                json={"into": into, "note": note})
    others = plural(got["group_size"] - 1, "other regression")
    out.print(f"regression {got['id']}: group {got['group_key']} ({others} in it)", highlight=False)


@regressions_app.command("group")
def regressions_group(
    regression_id: RegressionId,
    into: Annotated[int, typer.Option("--into", help="The regression whose group it joins")],
    note: Note = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Move a regression into another regression's group; the scan keeps it there."""
    _regroup(coordinator, admin_token, regression_id, into, note)


@regressions_app.command("ungroup")
def regressions_ungroup(
    regression_id: RegressionId, note: Note = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Move a regression out of its group into a group of its own; the scan keeps it there."""
    _regroup(coordinator, admin_token, regression_id, None, note)


@regressions_app.command("history")
def regressions_history(
    regression_id: RegressionId,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None, as_json: AsJson = False,
) -> None:
    """Every change a person made to a regression's status or group, oldest first, with who and when."""
    rows = _call(coordinator, admin_token, "GET", f"/regressions/{regression_id}/history")
    _print_rows(rows, as_json, plural(len(rows), "change"), ("when", "who", "change", "from", "to", "note"),
                lambda e: [_when(e["at"]), e["actor"], e["action"], e["old"] or "-", e["new"],
                           e["note"] or ""])


def _series(t: dict[str, Any]) -> str:
    return f"{t['kernel']} {t['shape']} {t['dtype']} on {t['chip']}"


@threshold_app.command("set")
def threshold_set(
    chip: Annotated[str, typer.Option("--chip", help="The series' chip")],
    kernel: Annotated[str, typer.Option("--kernel", help="The series' kernel")],
    shape: Annotated[str, typer.Option("--shape", help="The series' shape, e.g. 4096x4096")],
    dtype: Annotated[str, typer.Option("--dtype", help="The series' dtype")],
    min_effect: Annotated[float, typer.Option("--min-effect", help="The smallest slowdown that alerts for "
                                              "this series, e.g. 0.08 for 8 %")],
    note: Annotated[str | None, typer.Option("--note", help="Why (kept with the threshold)")] = None,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Set (or replace) one series' minimum effect.

    The detectors use it from the next run they check, and in the scan. The series must have stored
    runs."""
    got = _call(coordinator, admin_token, "PUT", "/regressions/thresholds",
                json={"chip": chip, "kernel": kernel, "shape": shape, "dtype": dtype,
                      "min_effect": min_effect, "note": note}, words={r"\bmin_effect\b": "--min-effect"})
    out.print(f"threshold {got['id']}: {_series(got)} alerts from {100 * got['min_effect']:.1f} %",
              highlight=False)


@threshold_app.command("list")
def threshold_list(coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
                   as_json: AsJson = False) -> None:
    """The series with a minimum effect of their own."""
    rows = _call(coordinator, admin_token, "GET", "/regressions/thresholds")
    _print_rows(rows, as_json, plural(len(rows), "threshold"),
                ("id", "chip", "kernel", "shape", "dtype", "min effect", "set by", "set at", "note"),
                lambda t: [str(t["id"]), t["chip"], t["kernel"], t["shape"], t["dtype"],
                           f"{100 * t['min_effect']:.1f} %", t["set_by"], _when(t["set_at"]),
                           t["note"] or ""])


@threshold_app.command("delete")
def threshold_delete(
    threshold_id: Annotated[int, typer.Argument(help="The threshold's id (see `threshold list`)")],
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None,
) -> None:
    """Remove a series' own minimum effect: the coordinator's setting applies to it again."""
    got = _call(coordinator, admin_token, "DELETE", f"/regressions/thresholds/{threshold_id}")
    out.print(f"threshold {got['id']} removed: {_series(got)} uses the coordinator's minimum effect again",
              highlight=False)


@webhooks_app.command("list")
def webhooks_list(
    state: Annotated[str | None, typer.Option("--state", help="pending, delivered or failed")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many rows")] = 100,
    coordinator: Coordinator = DEFAULT_COORDINATOR, admin_token: AdminToken = None, as_json: AsJson = False,
) -> None:
    """Webhook deliveries (one alert to one URL), newest first, with their last attempt."""
    params: dict[str, Any] = {"limit": limit} | ({"state": state} if state else {})
    rows = _call(coordinator, admin_token, "GET", "/webhooks/deliveries", params=params)

    def cells(d: dict[str, Any]) -> list[str]:
        last = d["attempt_log"][-1] if d["attempt_log"] else None
        answer = "-" if last is None else (last["error"] or str(last["status_code"]))[:50]
        return [str(d["id"]), str(d["regression_id"] or "-"), d["url"], d["state"], str(d["attempts"]),
                answer, _when(d["next_attempt_at"]) if d["state"] == "pending" else "-"]

    _print_rows(rows, as_json, plural(len(rows), "delivery", "deliveries"),
                ("id", "regression", "url", "state", "attempts", "last answer", "next attempt"), cells)


def register(app: typer.Typer) -> None:
    from kernelfleet.service import fleet_cli  # noqa: F401 - adds `admin tokens` and `admin add-worker`

    app.add_typer(admin_app, name="admin")
