"""The search over MLX's runtime knobs for one model at its workloads: a small grid first, then
around the best, then the choice confirmed against the defaults in fresh rounds, all within a
time budget.

1. *coarse*: every knob's grid values (:data:`.knobs.TABLE`), each alone, in rounds with stock and
   a control (:func:`.sides.measure_rounds`: one fresh process per side and round);
2. *refine*, per workload with a candidate faster beyond the noise and bit-identical: that candidate
   again, the geometric midpoints between it and its knob's neighbouring values (MLX's default
   among them), and, where other knobs also had such a winner, all winners together;
3. *confirm*: each workload's best of the refine stage against stock and a control in new rounds.
   Its interval is the one reported (the best of many noisy candidates reads high: a fresh
   measurement does not). A workload keeps MLX's defaults unless the confirmation is faster beyond
   the noise with bit-identical logits.

Every stage has stock and a control side. *Faster beyond the noise* (:func:`beyond_noise`): the
paired interval lies above 1 and above the control's interval from the same rounds. *Bit-identical*:
the side's logits hashes equal stock's in every process (:func:`.sides.compare`).

The budget is checked before every round (:func:`.sides.measure_rounds`; the coarse stage's first
round always runs): a stage the budget no longer covers is skipped or cut short, and a workload left
unconfirmed keeps the defaults, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.runtime_settings_file import dtype_label

from .knobs import Knob, Setting, midpoints
from .knobs import defaults as knob_defaults
from .sides import CONTROL, STOCK, Comparison, Rounds, compare, key, measure_rounds, stock_logits


@dataclass(frozen=True)
class Objective:
    """A model and its workloads, as :mod:`.step` measures them."""

    config: dict[str, Any]
    dtype: str  # the activations' dtype: "bfloat16" (a quantized model's too), "float32" on CPU
    quant: tuple[int, int] | None
    workloads: tuple[str, ...]
    context: int = 512
    steps: int = 64
    reps: int = 3

    @property
    def label(self) -> str:
        """The model's dtype as entries name it (:func:`kernelfleet.runtime_settings_file.dtype_label`)."""
        return dtype_label("bf16" if self.quant is None else f"{self.quant[0]}bit", self.dtype)

    def request(self) -> dict[str, Any]:
        return {"config": self.config, "dtype": self.dtype, "quant": self.quant,
                "workloads": list(self.workloads), "context": self.context, "steps": self.steps,
                "reps": self.reps}


@dataclass
class Choice:
    """A workload's outcome: ``setting`` ({}: MLX's defaults) and the confirmation behind it."""

    workload: str
    setting: Setting = field(default_factory=dict)
    confirmed: Comparison | None = None
    control: Comparison | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def entry(self, model: str, dtype: str) -> dict[str, Any]:
        """This outcome as a runtime-settings file entry (:mod:`kernelfleet.runtime_settings_file`).
        ``round_gains``: the chosen settings' gain in each confirmation round; with MLX's defaults
        kept, the control's (stock against stock: what the defaults give, with the pairing's noise).
        The coordinator compares them across MLX versions (a gain lost is a regression)."""
        c, ctl = self.confirmed, self.control
        rounds = c.round_gains if c and self.setting else ctl.round_gains if ctl else ()
        return {"model": model, "dtype": dtype, "workload": self.workload, "settings": self.setting,
                "gain": c.ratio if c and self.setting else 1.0,
                "interval": [c.low, c.high] if c and self.setting else None,
                "verdict": c.verdict if c else None, "bit_identical": c.bit_identical if c else None,
                "rounds": c.rounds if c else 0, "round_gains": list(rounds),
                "control": {"gain": ctl.ratio, "interval": [ctl.low, ctl.high]} if ctl else None,
                "evidence": self.evidence, "note": self.note}


Log = Callable[[str], None]


MIN_ROUNDS = 3  # fewer rounds give no interval worth the name (one round: a point)


def beyond_noise(c: Comparison, control: Comparison) -> bool:
    """Faster beyond the noise: over at least :data:`MIN_ROUNDS` rounds, the interval lies above 1
    and above the control's (stock against stock in the same rounds: on a busy host the pairing
    itself can read 0.8x or 1.2x)."""
    return c.rounds >= MIN_ROUNDS and c.low > max(1.0, control.high)


def against_control(c: Comparison, control: Comparison) -> str:
    """The verdict with the control's noise counted: faster (:func:`beyond_noise`), slower (over at
    least :data:`MIN_ROUNDS` rounds, the interval below 1 and below the control's), else within the
    noise."""
    if beyond_noise(c, control):
        return "faster"
    if c.rounds >= MIN_ROUNDS and c.high < min(1.0, control.low):
        return "slower"
    return "within the noise"


def _winners(rounds: Rounds, workload: str, sides: list[str]) -> list[Comparison]:
    """The sides faster than stock beyond the noise with bit-identical logits, best first."""
    control = compare(rounds, CONTROL, workload)
    found = [c for c in (compare(rounds, s, workload) for s in sides)
             if c.bit_identical and beyond_noise(c, control)]
    return sorted(found, key=lambda c: -c.ratio)


def _record(choices: dict[str, Choice], rounds: Rounds, stage: str, sides: list[str], log: Log) -> None:
    for w, choice in choices.items():
        for s in [*sides, CONTROL]:
            c = compare(rounds, s, w)
            choice.evidence.append(c.evidence(stage if s != CONTROL else f"{stage}: control"))
            same = "bit-identical" if c.bit_identical else "LOGITS DIFFER: rejected"
            side = key(c.setting) if s != CONTROL else "(control: stock against stock)"
            log(f"  {stage:8} {w:13} {side:55} {c.ratio:6.3f}x [{c.low:.3f}, {c.high:.3f}] {c.verdict}, "
                f"{same}")


def search(objective: Objective, knobs: tuple[Knob, ...], *, budget_s: float,
           rounds: int, log: Log = print, timeout: float = 600.0
           ) -> tuple[dict[str, Choice], dict[str, Any]]:
    """Each workload's choice, and the device the steps ran on (:mod:`.step`'s ``device``, ``backend``,
    ``arch``, ``mlx_version``). MLX's own default of a knob (:func:`.knobs.defaults`, for the GPU the
    first round ran on) is a neighbour of its best value when refining."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"rounds: at least {MIN_ROUNDS} (fewer give no interval)")
    deadline = time.monotonic() + budget_s
    choices = {w: Choice(w) for w in objective.workloads}
    origin: dict[str, tuple[Knob, tuple[int | str, ...]]] = {}
    for knob in knobs:
        for values in knob.grid:
            origin[key(knob.setting(values))] = (knob, values)
    request = objective.request()

    coarse = measure_rounds(request, [knob.setting(v) for knob in knobs for v in knob.grid], rounds,
                            deadline, timeout=timeout)
    log(f"coarse: {len(coarse.settings)} sides x {coarse.count} rounds ({coarse.estimate:.1f} s a process "
        f"at most, {coarse.first_s:.1f} s the first) on {coarse.device.get('device')}")
    tried = [s for s in coarse.settings if s not in (STOCK, CONTROL)]
    _record(choices, coarse, "coarse", tried, log)

    refine: dict[str, Setting] = {}
    best: dict[str, str] = {}
    for w, choice in choices.items():
        won = _winners(coarse, w, tried)
        if not won:
            if coarse.count < MIN_ROUNDS:
                choice.note = f"budget spent after {coarse.count} coarse round(s) (a verdict needs " \
                              f"{MIN_ROUNDS})"
            else:
                choice.note = "no setting of the grid was faster beyond the noise with bit-identical logits"
                seen = len(stock_logits(coarse, w))
                if seen > 1:
                    choice.note += f" (stock's own took {seen} values from run to run)"
            continue
        top = won[0]
        best[w] = key(top.setting)
        refine[best[w]] = top.setting
        knob, values = origin[best[w]]
        mlx = knob_defaults(coarse.device["backend"], coarse.device["arch"], coarse.device["mlx_version"])
        default = tuple(int(mlx[e]) for e in knob.envs) if all(e in mlx for e in knob.envs) else None
        for mid in midpoints(knob, values, default):
            refine[key(knob.setting(mid))] = knob.setting(mid)
        others = [c.setting for c in won[1:] if origin[key(c.setting)][0] != knob]
        merged = dict(top.setting)
        for s in others:
            if not set(s) & set(merged):
                merged.update(s)
        if merged != top.setting:
            refine[key(merged)] = merged
    fine = measure_rounds(request, list(refine.values()), rounds, deadline, timeout=timeout,
                          first_free=False, process_s=coarse.estimate) if refine else None
    for w in list(best):
        if fine is None or fine.count < MIN_ROUNDS:
            choices[w].note = f"budget spent after {fine.count if fine else 0} refine round(s)"
            del best[w]
            continue
        _record({w: choices[w]}, fine, "refine", list(refine), log)
        won = _winners(fine, w, list(refine))
        if won:
            best[w] = key(won[0].setting)
        else:
            del best[w]
            choices[w].note = "its coarse winner was not faster beyond the noise again"

    chosen = {best[w]: refine[best[w]] for w in best}
    confirm = measure_rounds(request, list(chosen.values()), rounds, deadline, timeout=timeout,
                             first_free=False, process_s=coarse.estimate) if chosen else None
    for w, side in best.items():
        choice = choices[w]
        if confirm is None or confirm.count < MIN_ROUNDS:
            choice.note = f"budget spent after {confirm.count if confirm else 0} confirmation round(s)"
            continue
        _record({w: choice}, confirm, "confirm", [side], log)
        c = compare(confirm, side, w)
        choice.control = compare(confirm, CONTROL, w)
        choice.confirmed = c
        if c.bit_identical and beyond_noise(c, choice.control):
            choice.setting = c.setting
        else:
            differ = "" if c.bit_identical else ", logits differ"
            choice.note = (f"its confirmation read {c.verdict} over {c.rounds} rounds (control "
                           f"{choice.control.low:.3f}-{choice.control.high:.3f}){differ}")
    if STOCK in coarse.seconds:
        for w, choice in choices.items():
            if choice.control is None:
                choice.control = compare(coarse, CONTROL, w)
    return choices, coarse.device
