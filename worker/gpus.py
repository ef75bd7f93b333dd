"""``kernelfleet worker --gpus all|0,1,...``: one worker agent per GPU of a multi-GPU host.

Each agent is a process of its own with ``CUDA_VISIBLE_DEVICES`` set to its GPU, its own state
directory (``<state dir>/gpu<i>``: token, spool, lock) and name (``<name>-gpu<i>``), so the
coordinator sees one worker per GPU and leases each its own jobs. They enroll with one enrollment
token minted for that many workers (``kernelfleet admin add-worker --gpus N``; a worker enrolled before
reuses its stored token). This process forwards SIGTERM/SIGINT to them, prefixes their output with
``[gpu<i>]`` and exits with the first non-zero exit code among them (0 when all stopped cleanly).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from .child import worker_command, worker_env


class GpuSpecError(ValueError):
    pass


def detected_gpus() -> list[str]:
    """This host's GPUs as CUDA_VISIBLE_DEVICES values: those already visible to us when the variable
    is set, else every NVIDIA GPU ``nvidia-smi -L`` lists (or /proc/driver/nvidia/gpus holds)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    found = re.findall(r"^GPU (\d+):", listed, re.M)
    if found:
        return found
    proc = Path("/proc/driver/nvidia/gpus")
    return [str(i) for i in range(len(list(proc.iterdir())))] if proc.is_dir() else []


def resolve(spec: str) -> list[str]:
    """``all`` (every detected GPU) or a comma-separated list of GPU indices, e.g. ``0,1``."""
    text = spec.strip().lower()
    if text == "all":
        gpus = detected_gpus()
        if not gpus:
            raise GpuSpecError("--gpus all: no NVIDIA GPU found (nvidia-smi -L lists none); run one "
                               "`kernelfleet worker` without --gpus on this machine")
        return gpus
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise GpuSpecError(f"--gpus {spec!r}: expected 'all' or GPU indices such as 0,1")
    if len(set(parts)) != len(parts):
        raise GpuSpecError(f"--gpus {spec!r} names a GPU twice")
    return parts


def _relay(stream: IO[bytes], prefix: str) -> None:
    for line in iter(stream.readline, b""):
        sys.stderr.write(f"{prefix} {line.decode(errors='replace').rstrip()}\n")
        sys.stderr.flush()


def run_per_gpu(gpus: Sequence[str], worker_args: Sequence[str], state_dir: Path, name: str,
                enroll_token: str | None) -> int:
    """Start one ``kernelfleet worker`` per GPU and wait for them all; returns the exit code."""
    procs: list[subprocess.Popen[bytes]] = []
    relays: list[threading.Thread] = []
    for gpu in gpus:
        env = {**worker_env(enroll_token), "CUDA_VISIBLE_DEVICES": gpu}
        state = state_dir / f"gpu{gpu}"
        cmd = worker_command(*worker_args, "--state-dir", str(state), "--name", f"{name}-gpu{gpu}")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)  # our signals reach them through us, once
        procs.append(proc)
        sys.stderr.write(f"gpu {gpu}: worker pid {proc.pid} (CUDA_VISIBLE_DEVICES={gpu}, state in {state})\n")
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(proc.stdout, f"[gpu{gpu}]"), daemon=True)
        relay.start()
        relays.append(relay)

    def forward(signum: int, _frame: FrameType | None) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        codes = [proc.wait() for proc in procs]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for relay in relays:
        relay.join(timeout=5)
    return next((c for c in codes if c != 0), 0)
