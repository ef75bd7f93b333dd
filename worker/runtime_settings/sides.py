"""Settings measured by turns, each side in a fresh process: stock (every knob unset), the
candidates, and a control (stock again), in rounds whose order rotates, so no side always runs
first or last. Per candidate and workload: its speed over stock paired by round, with the 95 %
bootstrap interval (:func:`kernelfleet.kernels.patch.model_timing.paired_speedup`), and whether
each of its processes' logits was bit-identical to one of stock's own (:func:`stock_logits`).

This process never touches MLX's device; the processes it starts (:mod:`.step`) do.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.kernels.patch.paired import paired_speedup, verdict

from ..child import module_command
from .knobs import TABLE, TEST_ONLY_DTYPE, Setting

STOCK, CONTROL = "stock", "stock again"
STEP_MODULE = "kernelfleet.worker.runtime_settings.step"


class StepError(RuntimeError):
    """A step process failed (its stderr's tail is in the message)."""


def knob_envs() -> set[str]:
    return {env for table in TABLE.values() for k in table for env in k.envs} | {TEST_ONLY_DTYPE}


def environment(setting: Setting) -> dict[str, str]:
    """This process's environment with every knob removed (MLX's defaults), then ``setting``."""
    envs = knob_envs()
    return {**{k: v for k, v in os.environ.items() if k not in envs}, **setting}


def key(setting: Setting) -> str:
    """A setting as its environment line: ``MLX_A=1 MLX_B=2`` (empty: MLX's defaults)."""
    return " ".join(f"{k}={v}" for k, v in sorted(setting.items()))


def run_step(request: dict[str, Any], setting: Setting, timeout: float) -> dict[str, Any]:
    """One fresh process measuring ``request`` (:mod:`.step`'s format) under ``setting``."""
    try:
        r = subprocess.run(module_command(STEP_MODULE), input=json.dumps(request), text=True,
                           capture_output=True, env=environment(setting), timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise StepError(f"step under [{key(setting) or 'defaults'}] ran past {timeout:.0f} s") from e
    if r.returncode:
        raise StepError(f"step under [{key(setting) or 'defaults'}] failed ({r.returncode}): "
                        f"{r.stderr.strip()[-1500:]}")
    answer: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return answer


@dataclass
class Rounds:
    """Per side (STOCK, CONTROL or a setting's :func:`key`), per workload: one time per round, and the
    logits hashes seen."""

    settings: dict[str, Setting]
    seconds: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    logits: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    # the slowest step process seen (start to exit), the first left out once another has run: the
    # first pays one-time costs the later ones do not (a 4-bit Llama's first process on an H200: 82 s;
    # the rest of its command, 35 more processes, 108 s), and judged by it a search's budget held one
    # round, not three
    process_s: float = 0.0
    first_s: float = 0.0  # that first process, where no estimate was given

    @property
    def estimate(self) -> float:
        """Seconds one more process is expected to take, at most."""
        return self.process_s or self.first_s

    @property
    def count(self) -> int:
        return min((len(t) for by_w in self.seconds.values() for t in by_w.values()), default=0)


def measure_rounds(request: dict[str, Any], candidates: list[Setting], rounds: int, deadline: float,
                   *, control: bool = True, timeout: float = 600.0, first_free: bool = True,
                   process_s: float = 0.0) -> Rounds:
    """Up to ``rounds`` rounds of stock, ``candidates`` and (``control``) stock again, one process
    each, in rotating order. A round that could not finish before ``deadline`` (judged by the slowest
    process so far, the first left out once another has run, or ``process_s`` before any) is not
    started; with ``first_free`` the first always is."""
    sides: dict[str, Setting] = {STOCK: {}, **{key(c): c for c in candidates}}
    if control:
        sides[CONTROL] = {}
    out = Rounds(settings=sides, process_s=process_s)
    names = list(sides)
    for r in range(rounds):
        if (r or not first_free) and time.monotonic() + out.estimate * len(names) > deadline:
            break
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            t0 = time.monotonic()
            answer = run_step(request, sides[name], timeout)
            took = time.monotonic() - t0
            if out.process_s or out.first_s:
                out.process_s = max(out.process_s, took)
            else:  # the first process, with no estimate given
                out.first_s = took
            out.device = {k: answer[k] for k in ("device", "backend", "arch", "mlx_version")}
            for w, s in answer["seconds"].items():
                out.seconds.setdefault(name, {}).setdefault(w, []).append(s)
                out.logits.setdefault(name, {}).setdefault(w, set()).add(answer["logits"][w])
    return out


@dataclass(frozen=True)
class Comparison:
    """A side against stock at one workload."""

    setting: Setting
    workload: str
    ratio: float  # stock seconds / side seconds, median over rounds: > 1 is faster
    low: float
    high: float
    rounds: int
    bit_identical: bool
    round_gains: tuple[float, ...] = ()  # each round's own pair: stock seconds / side seconds

    @property
    def verdict(self) -> str:
        return verdict(self.low, self.high)

    def evidence(self, stage: str) -> dict[str, Any]:
        return {"stage": stage, "settings": self.setting, "gain": self.ratio,
                "interval": [self.low, self.high], "verdict": self.verdict, "rounds": self.rounds,
                "bit_identical": self.bit_identical}


def stock_logits(rounds: Rounds, workload: str) -> set[str]:
    """The logits hashes MLX's defaults gave at ``workload`` (stock's and the control's processes).
    Usually one; on MLX's CUDA backend a quantized decode step's logits take one of two values from
    run to run even in one process (8-bit decode batch 1 and 4-bit batch 8, H200, MLX 0.32.4), so a
    side is bit-identical when each of its hashes is one of these: it computes what MLX's defaults
    compute, bit for bit, on one of their own runs."""
    return rounds.logits[STOCK][workload] | rounds.logits.get(CONTROL, {}).get(workload, set())


def compare(rounds: Rounds, side: str, workload: str) -> Comparison:
    stock, other = rounds.seconds[STOCK][workload], rounds.seconds[side][workload]
    n = min(len(stock), len(other))
    mid, lo, hi = paired_speedup(stock[:n], other[:n])
    same = rounds.logits[side][workload] <= stock_logits(rounds, workload)
    return Comparison(rounds.settings[side], workload, mid, lo, hi, n, same,
                      tuple(a / b for a, b in zip(stock[:n], other[:n], strict=True)))
