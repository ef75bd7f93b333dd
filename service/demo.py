"""``kernelfleet demo`` (``make demo``): a coordinator on a database of its own, filled with the GPU
reports the repository ships (``benchmarks/results/*_tuning.jsonl``: an NVIDIA H100 and an H200) and a
small campaign for this machine's CPU, which the local worker tunes: a three-chip dashboard without a
GPU. On CPU every speedup is 1.00x (MLX's CPU backend runs no custom kernel); the GPU chips show what
tuning does.

The reports go through the coordinator's own import API once it answers (a report imported before is
skipped, so a second ``make demo`` adds nothing), and the CPU campaign is queued once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet.service.client import AdminClient, ClientError, wait_until_healthy
from kernelfleet.service.import_cli import BadReportFile, _batches, read_reports

CPU_CAMPAIGN = "demo: this machine's CPU"
CPU_KERNELS = ["rmsnorm", "softmax"]
CPU_SHAPES = ["32x4096", "1024x4096"]


def default_reports(root: Path) -> list[Path]:
    return sorted((root / "benchmarks" / "results").glob("*_tuning.jsonl"))


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """Every report of ``paths`` (each file checked whole, as `kernelfleet import` does)."""
    if not paths:
        raise BadReportFile("no reports to show: pass the JSONL files, e.g. benchmarks/results/"
                            "*_tuning.jsonl in a clone of the repository (`make demo` does)")
    return [r for path in paths for r in read_reports(path)]


def fill(coordinator: str, token: str, reports: list[dict[str, Any]]) -> tuple[int, list[str], bool]:
    """Import ``reports`` and queue the CPU campaign unless there is one; returns (imported, the
    reports' chips, whether the campaign was queued now)."""
    imported = 0
    with AdminClient(coordinator, token) as client:
        for batch in _batches(reports):
            imported += int(client.request("POST", "/results/import", json={"reports": batch})["imported"])
        queued = not any(c["name"] == CPU_CAMPAIGN for c in client.request("GET", "/campaigns"))
        if queued:
            client.request("POST", "/campaigns", json={
                "name": CPU_CAMPAIGN, "kernels": CPU_KERNELS, "shapes": CPU_SHAPES, "dtypes": ["float32"],
                "target_backend": "cpu"})
    return imported, sorted({r["env"]["chip"] for r in reports}), queued


def fill_when_up(coordinator: str, token: Callable[[], str | None], reports: list[dict[str, Any]],
                 say: Callable[[str], None], timeout: float = 120.0) -> threading.Thread:
    """:func:`fill` on a thread, once the coordinator answers /healthz."""

    def run() -> None:
        if not wait_until_healthy(coordinator, timeout):
            say(f"demo: the coordinator did not answer at {coordinator} within {timeout:.0f} s")
            return
        secret = token()
        if secret is None:
            say("demo: no admin token to import with")
            return
        try:
            imported, chips, queued = fill(coordinator, secret, reports)
        except ClientError as e:
            say(f"demo: could not fill the dashboard: {e}")
            return
        campaign = (f"; queued {len(CPU_KERNELS) * len(CPU_SHAPES)} small jobs for this machine's CPU "
                    f"(the local worker tunes them)") if queued else ""
        say(f"demo: imported {imported} of {len(reports)} reports ({', '.join(chips)}){campaign}; "
            f"open {coordinator}/chips")

    thread = threading.Thread(target=run, name="demo-fill", daemon=True)
    thread.start()
    return thread
